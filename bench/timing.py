"""The bench scripts' one timer (peers.py, peer_numpy.py, python_overhead.py and, through the
latter, dropin_bench.py import it from bench/, their own folder): a callable's median wall
time. Standard library only, so that every script's environment has it."""
import statistics
import time


def median_time(fn, runs, warmup=1, unit=1e3):
    """fn's median wall time over `runs` calls after `warmup` untimed ones, in seconds times
    `unit` (1e3: milliseconds, 1e6: microseconds)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * unit)
    return statistics.median(times)
