#!/usr/bin/env python3
"""The attention backward against PyTorch on the same CPU, in one run.

clattn: `clattn bench --op backward --json` (the fused forward with lse, then the backward;
median of --runs device times). PyTorch: the forward softmax(q kᵀ scale [+ causal]) v and
its autograd backward in float32 on the same sizes, median of --runs wall times, threads =
the machine's cores. Debian's python3-torch (1.13) has no scaled_dot_product_attention, so
the peer is the math it runs on CPUs without its fused kernel; a torch 2.x venv
(`--python venv/bin/python` is not needed: run this script with that interpreter) times
F.scaled_dot_product_attention instead when it exists.

    python3 bench/backward_peers.py --clattn build/clattn --seq 256,1024 [--causal] [--dropout P]
        [--path unfused]

Prints one row per length: ms of each pass, backward / forward, and the forward + backward
step of clattn over torch's (> 1: clattn faster)."""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time


def clattn_times(binary, batch, heads, seq, dim, causal, runs, dropout, path="fused", warmup=3):
    cmd = [binary, "bench", "--op", "backward", "--batch", str(batch), "--heads", str(heads),
           "--seq", str(seq), "--head-dim", str(dim), "--runs", str(runs), "--json",
           "--path", path, "--warmup", str(warmup)]
    if causal:
        cmd.append("--causal")
    if dropout > 0:
        cmd += ["--dropout", str(dropout)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return row["forward_ms"], row["median_ms"], row["backward_workspace_bytes"]


def torch_times(torch, batch, heads, seq, dim, causal, runs, dropout, warmup=3):
    gen = torch.Generator().manual_seed(seq)
    shape = (batch, heads, seq, dim)
    q, k, v = (torch.randn(shape, generator=gen, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, generator=gen)
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    mask = None
    if causal and sdpa is None:
        mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)

    def forward():
        if sdpa is not None:
            return sdpa(q, k, v, is_causal=causal, dropout_p=dropout)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dim))
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        w = torch.softmax(s, dim=-1)
        if dropout > 0:
            w = torch.nn.functional.dropout(w, p=dropout)
        return w @ v

    fwd, bwd = [], []
    for _ in range(runs + warmup):  # the first `warmup` untimed
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        fwd.append((t1 - t0) * 1e3)
        bwd.append((t2 - t1) * 1e3)
        q.grad = k.grad = v.grad = None
    return statistics.median(fwd[warmup:]), statistics.median(bwd[warmup:]), sdpa is not None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clattn", default="build/clattn")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--seq", default="256,1024")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    # (both sides; a process's first PoCL launches can run at half speed: see bench/peers.py)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--path", choices=("fused", "unfused"), default="fused",
                    help="clattn's backward: fused, or the unfused reference path")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout_p on the weights, both sides (torch: in its own SDPA call)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("backward_peers: no torch (Debian: apt-get install python3-torch)")
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"# B={args.batch} H={args.heads} d={args.head_dim} f32 causal={args.causal}, "
          f"dropout={args.dropout}, clattn backward {args.path}, median of {args.runs} after {args.warmup} warm-up runs; torch {torch.__version__} ({os.cpu_count()} threads)")
    print("| L | clattn fwd ms | clattn bwd ms | bwd/fwd | torch fwd ms | torch bwd ms | "
          "torch bwd/fwd | fwd+bwd clattn/torch speed | clattn bwd workspace |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seq in (int(x) for x in args.seq.split(",")):
        cf, cb, ws = clattn_times(args.clattn, args.batch, args.heads, seq, args.head_dim,
                                  args.causal, args.runs, args.dropout, args.path, args.warmup)
        tf, tb, fused = torch_times(torch, args.batch, args.heads, seq, args.head_dim,
                                    args.causal, args.runs, args.dropout, args.warmup)
        print(f"| {seq} | {cf:.1f} | {cb:.1f} | {cb / cf:.2f} | {tf:.1f} | {tb:.1f} | "
              f"{tb / tf:.2f} | {(tf + tb) / (cf + cb):.2f}x | {ws} B |"
              + ("" if fused else " (torch: math)"))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
