#!/usr/bin/env python3
"""Peer timings for bench_core on the same CPU: numpy (OpenBLAS) float32 matmul, scaled
dot-product attention and a PyTorch-style MHA forward, same sizes as bench_core, median of
--runs runs after one warm-up. Prints the same columns so the two tables can be divided.

Run: pip install numpy threadpoolctl; python3 bench/peer_numpy.py [--runs N] [--quick]
"""
import argparse

import numpy as np

from timing import median_time  # bench/timing.py, next to this script

try:
    from threadpoolctl import threadpool_info
except ImportError:  # the BLAS description is informative only
    threadpool_info = None


def median_ms(fn, runs):
    return float(median_time(fn, runs))


def softmax_rows(s):
    s = s - s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def attention(q, k, v):
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
    return softmax_rows((q @ k.transpose(0, 1, 3, 2)) * scale) @ v


def mha(x, w_in, b_in, w_out, b_out, heads):
    b, l, e = x.shape
    qkv = x @ w_in.T + b_in
    q, k, v = (qkv[..., i * e:(i + 1) * e].reshape(b, l, heads, e // heads).transpose(0, 2, 1, 3)
               for i in range(3))
    o = attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, l, e)
    return o @ w_out.T + b_out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rand = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)
    if threadpool_info:
        for pool in threadpool_info():
            print(f"# {pool.get('internal_api')} {pool.get('version')} "
                  f"{pool.get('architecture')} threads={pool.get('num_threads')}")
    print(f"numpy {np.__version__}; median of {args.runs} runs after 1 warm-up")
    print(f"{'op':<10} {'size':<36} {'ms':>10} {'rate':>17}")
    sizes = [(512, 512, 512), (1024, 1024, 1024), (4096, 64, 4096)]  # clattn bench's defaults
    for m, n, k in sizes[:2] if args.quick else sizes:
        a, b = rand(m, k), rand(k, n)
        ms = median_ms(lambda: a @ b, args.runs)
        print(f"{'matmul':<10} m={m:<5} n={n:<5} k={k:<5}          {ms:10.3f} "
              f"{2 * m * n * k / ms / 1e6:9.1f} GFLOP/s")
    for seq in ([128] if args.quick else [512, 1024]):
        q, k, v = rand(1, 8, seq, 64), rand(1, 8, seq, 64), rand(1, 8, seq, 64)
        ms = median_ms(lambda: attention(q, k, v), args.runs)
        print(f"{'attention':<10} B=1 H=8  L={seq:<5} d=64            {ms:10.3f} "
              f"{4 * 8 * seq * seq * 64 / ms / 1e6:9.1f} GFLOP/s")
    e = 512
    for seq in ([128] if args.quick else [512, 1024]):
        x, w_in, b_in = rand(1, seq, e), rand(3 * e, e), rand(3 * e)
        w_out, b_out = rand(e, e), rand(e)
        ms = median_ms(lambda: mha(x, w_in, b_in, w_out, b_out, 8), args.runs)
        flops = 2.0 * seq * e * e * 4 + 4.0 * seq * seq * e
        print(f"{'mha':<10} B=1 L={seq:<5} E={e:<5} H=8            {ms:10.3f} "
              f"{flops / ms / 1e6:9.1f} GFLOP/s")


if __name__ == "__main__":
    main()
