#!/usr/bin/env python3
"""The cost of calling clattn from Python (issue 13), at small sizes where it shows.

For each size it times, median of --runs after a warm-up, on the default device:
  c_call     clattn_plan_execute + clFinish through ctypes on buffers already on the device
             (the C call: what any binding must pay; the plan is made once beforehand);
  numpy      clattn.scaled_dot_product_attention on numpy arrays (buffers made from the arrays,
             the plan from the context's cache, the result read back);
  pyopencl   the same call on pyopencl arrays already on the device (result left there; a
             queue.finish() closes each run);
and prints the Python layer's overhead over the C call for both. Needs pyopencl for the last
column (skipped without it). Run from a checkout with the package importable, e.g.
  PYTHONPATH=python CLATTN_LIBRARY=build/libclattn.so python3 bench/python_overhead.py
"""

import argparse
import ctypes
import statistics
import sys
import time

import numpy as np

import clattn
from clattn import _lib
from clattn._core import Buffer, layout


def median_us(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def c_call(ctx, shape):
    """A plan and device buffers for (B, H, L, d); returns the timed closure."""
    b, h, l, d = shape
    desc = _lib.SdpaDesc()
    _lib.lib.clattn_sdpa_desc_init(ctypes.byref(desc))
    for name in ("q", "k", "v", "out"):
        setattr(desc.tensors, name, layout(_lib.F32, shape))
    plan = ctypes.c_void_p()
    ctx.check(_lib.lib.clattn_sdpa_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(plan)))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    buffers = [Buffer(ctx, x) for _ in range(3)] + [Buffer(ctx, nbytes=x.nbytes)]
    tensors = _lib.Tensors()
    for name, buffer in zip(("q", "k", "v", "out"), buffers):
        setattr(tensors, name, layout(_lib.F32, shape))
        getattr(tensors, name).mem = buffer.mem

    def run():
        ctx.check(_lib.lib.clattn_plan_execute(plan, ctypes.byref(tensors), None, None, 0, None,
                                               None))
        ctx.check(_lib.lib.clattn_finish(ctx.handle))

    return run, plan, buffers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    try:
        import pyopencl as cl
        import pyopencl.array as cla
    except ImportError:
        cl = None
    ctx = clattn.default_context()
    print(f"device: {ctx.device_name}; median of {args.runs} runs after {args.warmup}")
    print(f"{'B,H,L,d':>14} {'c_call us':>10} {'numpy us':>10} {'+numpy':>8} "
          f"{'pyopencl us':>12} {'+pyopencl':>10}")
    for shape in [(1, 1, 1, 8), (1, 1, 16, 16), (1, 8, 64, 64), (1, 8, 256, 64)]:
        run_c, plan, keep = c_call(ctx, shape)
        t_c = median_us(run_c, args.runs, args.warmup)
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        t_np = median_us(lambda: clattn.scaled_dot_product_attention(x, x, x, ctx=ctx),
                         args.runs, args.warmup)
        t_cl = float("nan")
        if cl is not None:
            queue = cl.CommandQueue(cl.Context([lib_device(cl, ctx)]))
            xd = cla.to_device(queue, x)

            def run_cl():
                clattn.scaled_dot_product_attention(xd, xd, xd)
                queue.finish()

            t_cl = median_us(run_cl, args.runs, args.warmup)
        print(f"{','.join(map(str, shape)):>14} {t_c:10.1f} {t_np:10.1f} {t_np - t_c:8.1f} "
              f"{t_cl:12.1f} {t_cl - t_c:10.1f}")
        _lib.lib.clattn_plan_release(plan)
        del keep
    return 0


def lib_device(cl, ctx):
    """The pyopencl device that is clattn's default device (by name)."""
    name = ctx.device_name
    for platform in cl.get_platforms():
        for device in platform.get_devices():
            if device.name == name:
                return device
    raise SystemExit(f"python_overhead: pyopencl does not see '{name}'")


if __name__ == "__main__":
    sys.exit(main())
