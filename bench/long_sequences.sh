#!/usr/bin/env bash
# Fused vs unfused attention at L = 512 .. 16384 (B=1, H=8, d=64), one process per case so that
# each line's peak_rss_mib belongs to that case alone. Prints one JSON line per case.
# Usage: bench/long_sequences.sh [path/to/clattn]   (CLATTN_DEVICE picks the device)
set -euo pipefail
clattn=${1:-./build/clattn}
for seq in 512 1024 2048 4096 8192 16384; do
  for path in fused unfused; do
    runs=5; warmup=1
    if [ "$seq" -ge 8192 ]; then runs=1; fi
    if [ "$seq" -ge 16384 ]; then warmup=0; fi  # one run, kernel build included (< 1 s)
    "$clattn" bench --op attention --seq "$seq" --heads 8 --head-dim 64 --path "$path" \
      --runs "$runs" --warmup "$warmup" --json 2>/dev/null
  done
done
