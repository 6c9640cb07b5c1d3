#!/usr/bin/env python3
"""The cost of calling clattn from Python (issue 13), at small sizes where it shows.

For each size it times, median of --runs after a warm-up, on the default device:
  c_call     clattn_plan_execute + clFinish through ctypes on buffers already on the device
             (the C call: what any binding must pay; the plan is made once beforehand);
  c_copy     the C call with the copies a numpy call needs: q, k, v written to the device
             buffers, the output read back (blocking), straight through ctypes;
  numpy      clattn.scaled_dot_product_attention on numpy arrays (the second and later calls
             of a shape reuse the plan and its staging buffers), over c_copy;
  pyopencl   the same call on pyopencl arrays already on the device (result left there; a
             queue.finish() closes each run), over c_call;
  layer      the pyopencl call with clattn_plan_execute replaced by a no-op: the Python layer
             alone (argument checks, the cache lookup, binding, pyopencl's output array).
Needs pyopencl for the last columns (skipped without it). Run from a checkout with the package
importable, e.g.
  PYTHONPATH=python CLATTN_LIBRARY=build/libclattn.so python3 bench/python_overhead.py
"""

import argparse
import os

os.environ.setdefault("POCL_AFFINITY", "1")  # PoCL's workers pinned (docs/tuning.md)
import ctypes
import statistics
import sys

import numpy as np

import clattn
from clattn import _lib
from clattn._core import Buffer, layout
from timing import median_time  # bench/timing.py, next to this script


def median_us(fn, runs, warmup):
    return median_time(fn, runs, warmup, 1e6)


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
        ctx.check(_lib.lib.clattn_plan_execute(plan, ctypes.byref(tensors), _lib.ROLE_COUNT, None,
                                               None, 0, None, None))
        ctx.check(_lib.lib.clattn_finish(ctx.handle))

    queue = _lib.lib.clattn_ctx_queue(ctx.handle)
    out = np.empty_like(x)

    def run_copy():
        for buffer in buffers[:3]:
            _lib.cl.clEnqueueWriteBuffer(queue, buffer.mem, 0, 0, x.nbytes, x.ctypes.data, 0,
                                         None, None)
        ctx.check(_lib.lib.clattn_plan_execute(plan, ctypes.byref(tensors), _lib.ROLE_COUNT, None,
                                               None, 0, None, None))
        _lib.cl.clEnqueueReadBuffer(queue, buffers[3].mem, 1, 0, out.nbytes, out.ctypes.data, 0,
                                    None, None)

    return run, run_copy, plan, buffers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of all columns; the median of the rounds' medians")
    args = parser.parse_args()
    try:
        import pyopencl as cl
        import pyopencl.array as cla
    except ImportError:
        cl = None
    ctx = clattn.default_context()
    print(f"device: {ctx.device_name}; median of {args.rounds} rounds of a median of "
          f"{args.runs} runs after {args.warmup}")
    print(f"{'B,H,L,d':>14} {'c_call us':>10} {'c_copy us':>10} {'numpy us':>9} {'+numpy':>7} "
          f"{'pyopencl us':>12} {'+pyopencl':>10} {'layer us':>9}")
    for shape in [(1, 1, 1, 8), (1, 1, 16, 16), (1, 8, 64, 64), (1, 8, 256, 64)]:
        run_c, run_copy, plan, keep = c_call(ctx, shape)
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        # interleaved rounds, so that load on the machine hits every column alike
        times = {"c": [], "copy": [], "np": [], "cl": [], "layer": []}
        queue = xd = None
        if cl is not None:
            queue = cl.CommandQueue(cl.Context([lib_device(cl, ctx)]))
            xd = cla.to_device(queue, x)

        def run_cl():
            clattn.scaled_dot_product_attention(xd, xd, xd)
            queue.finish()

        def run_layer():
            execute = _lib.lib.clattn_plan_execute
            _lib.lib.clattn_plan_execute = lambda *a: 0
            try:
                return median_us(lambda: clattn.scaled_dot_product_attention(xd, xd, xd),
                                 args.runs, args.warmup)
            finally:
                _lib.lib.clattn_plan_execute = execute

        for _ in range(args.rounds):
            times["c"].append(median_us(run_c, args.runs, args.warmup))
            times["copy"].append(median_us(run_copy, args.runs, args.warmup))
            times["np"].append(median_us(
                lambda: clattn.scaled_dot_product_attention(x, x, x, ctx=ctx), args.runs,
                args.warmup))
            if cl is not None:
                times["cl"].append(median_us(run_cl, args.runs, args.warmup))
                times["layer"].append(run_layer())
        t = {name: statistics.median(v) if v else float("nan") for name, v in times.items()}
        print(f"{','.join(map(str, shape)):>14} {t['c']:10.1f} {t['copy']:10.1f} "
              f"{t['np']:9.1f} {t['np'] - t['copy']:7.1f} {t['cl']:12.1f} "
              f"{t['cl'] - t['c']:10.1f} {t['layer']:9.1f}")
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
