#!/usr/bin/env python3
"""What the drop-ins cost (issue 46): clattn behind torch's, flash-attn's and transformers'
interfaces against torch itself, in one run on the same CPU (clattn on the default OpenCL
device, PoCL here; torch on the same cores). Median of --runs after a warm-up, milliseconds.

  sdpa        clattn.scaled_dot_product_attention vs torch's SDPA, (B, H, L, D) tensors
  flash_attn  clattn.flash_attn.flash_attn_func on (B, L, H, D) (the same kernel through
              strided views) vs clattn's SDPA on the transposed tensors
  mha         clattn.MultiheadAttention (the nn.Module) vs torch.nn.MultiheadAttention,
              forward + backward, with need_weights=True (torch's default: the weights come
              from clattn's unfused path) and False (the fused kernel alone)
  llama       a Llama of 4 layers (hidden 512, 8 heads, 2 kv heads, random weights) with
              attn_implementation "clattn", "sdpa" and "eager": a prefill forward, and greedy
              generate of 32 tokens (KV-cache decode)

Needs torch and transformers (a venv: never pip-install them system-wide), e.g.
  PYTHONPATH=python CLATTN_LIBRARY=build/libclattn.so venv/bin/python bench/dropin_bench.py
"""

import argparse
import os

os.environ.setdefault("POCL_AFFINITY", "1")  # PoCL's workers pinned (docs/tuning.md)

import torch

import clattn
from python_overhead import median_us  # bench/: the same timer as the overhead benchmark


def median_ms(fn, runs, warmup=1):
    return median_us(fn, runs, warmup) / 1e3


def row(name, ours, theirs, peer):
    print(f"| {name} | {ours:.1f} | {theirs:.1f} | {theirs / ours:.2f}x {peer} |", flush=True)


def bench_sdpa(runs, lengths):
    print("\n| sdpa, B=1 H=8 D=64 | clattn ms | torch ms | speed vs |\n|---|---:|---:|---|")
    for n in lengths:
        q, k, v = (torch.randn(1, 8, n, 64) for _ in range(3))
        for causal in (False, True):
            ours = median_ms(lambda: clattn.scaled_dot_product_attention(
                q, k, v, is_causal=causal), runs)
            theirs = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal), runs)
            row(f"L={n}{' causal' if causal else ''}", ours, theirs, "torch SDPA")


def bench_flash_attn(runs, lengths):
    from clattn.flash_attn import flash_attn_func
    print("\n| flash_attn_func, B=1 H=8 D=64, causal | flash_attn ms | clattn SDPA ms "
          "| speed vs |\n|---|---:|---:|---|")
    for n in lengths:
        q, k, v = (torch.randn(1, n, 8, 64) for _ in range(3))
        ours = median_ms(lambda: flash_attn_func(q, k, v, causal=True), runs)
        theirs = median_ms(lambda: clattn.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True), runs)
        row(f"L={n}", ours, theirs, "SDPA on (B, H, L, D)")


def bench_mha(runs, lengths):
    print("\n| MultiheadAttention E=512 H=8 B=1, forward+backward | clattn ms | torch ms "
          "| speed vs |\n|---|---:|---:|---|")
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(512, 8, batch_first=True)
    ours = clattn.MultiheadAttention(512, 8, batch_first=True)
    ours.load_state_dict(ref.state_dict())
    for n in lengths:
        x = torch.randn(1, n, 512, requires_grad=True)
        for need in (True, False):
            def step(m):
                out, w = m(x, x, x, need_weights=need)
                out.sum().backward()
            row(f"L={n} need_weights={need}", median_ms(lambda: step(ours), runs),
                median_ms(lambda: step(ref), runs), "torch")


def bench_llama(runs, lengths):
    import transformers
    import clattn.transformers as hf
    name = hf.register()
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                      num_hidden_layers=4, num_attention_heads=8,
                                      num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    print("\n| Llama 4 layers, hidden 512 | clattn ms | sdpa ms | eager ms |"
          "\n|---|---:|---:|---:|")
    for n in lengths:
        ids = torch.randint(0, 1000, (1, n))
        times = {}
        for impl in (name, "sdpa", "eager"):
            model.set_attn_implementation(impl)
            with torch.no_grad():
                times[impl] = median_ms(lambda: model(ids), runs)
        print(f"| prefill L={n} | {times[name]:.1f} | {times['sdpa']:.1f} | "
              f"{times['eager']:.1f} |", flush=True)
        times = {}
        for impl in (name, "sdpa", "eager"):
            model.set_attn_implementation(impl)
            with torch.no_grad():
                times[impl] = median_ms(lambda: model.generate(
                    ids, max_new_tokens=32, min_new_tokens=32, do_sample=False), max(1, runs // 2))
        print(f"| prompt {n} + 32 greedy tokens | {times[name]:.1f} | {times['sdpa']:.1f} | "
              f"{times['eager']:.1f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 1024, 2048])
    ap.add_argument("--only", nargs="*", default=["sdpa", "flash_attn", "mha", "llama"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"device: {clattn.default_context().device_name}; torch {torch.__version__} "
          f"({args.threads} threads); median of {args.runs}")
    for part in args.only:
        globals()[f"bench_{part}"](args.runs, args.lengths)


if __name__ == "__main__":
    main()
