#!/usr/bin/env python3
"""A KV cache's decode step in one launch (clattn_kv_cache_decode) against the same step in
two (clattn_kv_cache_append, then the plan: `clattn bench --op decode --two-launch`) and
against PyTorch doing it (the new key and value written into a preallocated cache, then SDPA
of one query row per head over the filled part: bench/peers.py's decode case), side by side:
each round runs the three in turn (the order rotated per round), and the table gives each
one's median over the rounds. clattn's times are its device times (profiling events, the
first kernel's start to the last one's end, as `clattn bench` reports them; wall times too);
PyTorch's are wall times with torch.set_num_threads(THREADS), their median over the rounds'
medians and the fastest single step (on a loaded host PyTorch's two OpenMP threads wait for
each other: the fastest is the comparison least kind to clattn).

    PYTHONPATH= /work/venv-torch/bin/python bench/decode_step.py [--rounds 5] [--threads 2]
        [--clattn build/clattn] [--lengths 1024,2048,4096,16384]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = ((8, 8, 64), (32, 8, 128))  # (heads, kv_heads, head_dim)


def clattn_step(binary, length, heads, kv_heads, d, two_launch, runs, warmup):
    """(device ms, wall ms, launches) of one decode step, clattn bench's medians."""
    cmd = [binary, "bench", "--op", "decode", "--path", "fused", "--batch", "1", "--heads",
           str(heads), "--kv-heads", str(kv_heads), "--head-dim", str(d), "--seq", str(length),
           "--runs", str(runs), "--warmup", str(warmup), "--json"]
    if two_launch:
        cmd.append("--two-launch")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = json.loads(out.strip().splitlines()[-1])
    return line["median_ms"], line["wall_ms"], line.get("launches")


def torch_step(torch, length, heads, kv_heads, d, runs, warmup):
    """Wall ms of PyTorch's step: the median and the fastest of runs after warmup."""
    rand = lambda *s: torch.rand(*s, dtype=torch.float32) * 2 - 1  # noqa: E731
    k_cache, v_cache = rand(1, kv_heads, length, d), rand(1, kv_heads, length, d)
    k_new, v_new, q = rand(1, kv_heads, 1, d), rand(1, kv_heads, 1, d), rand(1, heads, 1, d)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def step():
        k_cache[:, :, length - 1:length] = k_new
        v_cache[:, :, length - 1:length] = v_new
        return sdpa(q, k_cache[:, :, :length], v_cache[:, :, :length],
                    enable_gqa=kv_heads != heads)

    times = []
    with torch.inference_mode():
        for i in range(warmup + runs):
            start = time.perf_counter()
            step()
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clattn", default="build/clattn")
    parser.add_argument("--lengths", default="1024,2048,4096,16384")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    cpu = next((line.split(":", 1)[1].strip() for line in
                subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith("Model name")), "?")
    print(f"# CPU: {cpu}; torch {torch.__version__}, {args.threads} threads; "
          f"{args.rounds} rounds x {args.runs} runs (after {args.warmup})")
    print("| shape | cache | one launch ms (wall) | two launches ms (wall) | torch ms (fastest) | "
          "one/two speed-up | one vs torch | two vs torch | one vs torch's fastest | launches |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for heads, kv_heads, d in SHAPES:
        for length in lengths:
            one, two, peer, one_wall, two_wall, counts = [], [], [], [], [], set()
            fastest = float("inf")
            for r in range(args.rounds):
                order = [0, 1, 2][r % 3:] + [0, 1, 2][:r % 3]
                for which in order:
                    if which == 2:
                        # (PyTorch's first calls in a process run far slower: more warm-up)
                        median, best = torch_step(torch, length, heads, kv_heads, d,
                                                  max(args.runs, 200), max(args.warmup, 50))
                        peer.append(median)
                        fastest = min(fastest, best)
                        continue
                    dev, wall, launches = clattn_step(args.clattn, length, heads, kv_heads, d,
                                                      which == 1, args.runs, args.warmup)
                    (two if which else one).append(dev)
                    (two_wall if which else one_wall).append(wall)
                    counts.add((which, launches))
            m1, m2, mt = (statistics.median(x) for x in (one, two, peer))
            w1, w2 = statistics.median(one_wall), statistics.median(two_wall)
            launches = "/".join(str(n) for _, n in sorted(counts))
            shape = f"H={heads}" + (f" Hkv={kv_heads}" if kv_heads != heads else "") + f" d={d}"
            print(f"| {shape} | {length} | {m1:.4f} ({w1:.4f}) | {m2:.4f} ({w2:.4f}) | "
                  f"{mt:.4f} ({fastest:.4f}) | {m2 / m1:.2f}x | {mt / m1:.2f}x | {mt / m2:.2f}x | "
                  f"{fastest / m1:.2f}x | {launches} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
