#!/usr/bin/env bash
# tests/resources/capture.sh BUILD_DIR [OUT]
#
# Records the GPU kernel variants clattn builds: runs small `clattn bench` and `clattn demo`
# cases under Oclgrind as a GPU stand-in (CLATTN_PARAMS=gpu, --local-mem-size 49152: NVIDIA's
# 48 KiB per work-group, so the host shrinks the fused kernel's tiles as it would there) with
# the shim log_builds.c preloaded, which logs each clBuildProgram's kernel file and options.
# Writes the unique lines, "FILE<TAB>OPTIONS", sorted, to OUT (default: stdout). run.sh
# compiles the variants of tests/resources/variants.txt; this script is how that file was
# made and how to check it is still what the host builds (`diff` its output against it).
#
# Sequences: 64 query rows (so the fused kernel keeps its 64-row blocks; shorter ones shrink
# FG_BQ) over 8 keys, one head: a few seconds per case under Oclgrind; about 4 minutes in all.
set -u -o pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [OUT]" >&2; exit 2; }
build=$(cd "$1" && pwd) || exit 2
out=${2:-/dev/stdout}
here=$(cd "$(dirname "$0")" && pwd)
command -v oclgrind >/dev/null || { echo "$0: oclgrind not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -shared -fPIC -O2 -o "$work/log_builds.so" "$here/log_builds.c" -ldl || exit 1
log=$work/builds.txt
: >"$log"

run() { # run clattn with the ARGS given under Oclgrind with the shim, logging builds
    CLATTN_BUILD_LOG=$log CLATTN_PARAMS=gpu oclgrind --local-mem-size 49152 \
        sh -c 'LD_PRELOAD=$0:$LD_PRELOAD exec "$@"' "$work/log_builds.so" \
        "$build/clattn" "$@" >/dev/null 2>"$work/err" ||
        { echo "$0: clattn $* failed:" >&2; cat "$work/err" >&2; exit 1; }
}
small=(--runs 1 --warmup 0 --batch 1 --heads 1 --seq 64 --seq-k 8)
# The fused kernel (flash_gpu.cl) per head size, float32, no mask / U8 padding / float mask;
# 16-bit storage at the common head sizes; the unfused path (matmul.cl, softmax.cl) once per
# dtype and mask.
for d in 32 64 80 96 128 256; do
    for mask in none padding additive; do
        run bench --op attention --path fused --head-dim "$d" --mask "$mask" "${small[@]}"
    done
done
for d in 64 128; do
    run bench --op attention --path fused --head-dim "$d" --dtype f16,bf16 "${small[@]}"
done
for mask in none padding additive; do
    run bench --op attention --path unfused --head-dim 64 --dtype f32,f16,bf16 --mask "$mask" \
        "${small[@]}"
done
# The portable defaults on a GPU (CLATTN_TUNING=default: no table row, so not flash_gpu.cl):
# flash.cl, one query row per work-item, which GPUs also run where flash_gpu.cl does not fit.
for d in 64 128; do
    CLATTN_TUNING=default run bench --op attention --path fused --head-dim "$d" "${small[@]}"
done
# A bool attn_mask (MASK_DTYPE=3): through `clattn sdpa`, on .npy files written here.
python3 - "$work" <<'PY' || exit 1
import struct, sys
def npy(path, descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(data)
count = lambda shape: shape[0] * shape[1] * shape[2] * shape[3]
for name, shape in (("q", (1, 1, 64, 64)), ("k", (1, 1, 8, 64)), ("v", (1, 1, 8, 64))):
    values = [((i * 7919) % 101) / 101.0 - 0.5 for i in range(count(shape))]
    npy("%s/%s.npy" % (sys.argv[1], name), "<f4", shape, struct.pack("<%df" % len(values), *values))
npy(sys.argv[1] + "/mask.npy", "|b1", (64, 8), bytes((i % 3 != 0) for i in range(64 * 8)))
PY
for path in fused unfused; do
    run sdpa --q "$work/q.npy" --k "$work/k.npy" --v "$work/v.npy" --attn-mask "$work/mask.npy" \
        --path "$path" --out "$work/y.npy"
done
# Decode: one query row per head over a short cache, grouped heads; fused and unfused.
run bench --op decode --head-dim 128 --heads 8 --kv-heads 2 --seq 64 --runs 1 --warmup 0 \
    --batch 1
# MHA with rotary embeddings (heads.cl, rope.cl), additive attention (additive.cl and flash.cl's
# ADDITIVE variant), positional encodings (posenc.cl).
run bench --op mha --embed 64 --heads 2 --rope --seq 16 --runs 1 --warmup 0 --batch 1
run bench --op additive --embed 32 --heads 2 --head-dim 16 --seq 16 --runs 1 --warmup 0 \
    --batch 1
run demo posenc
run demo rope
{
    echo "# The GPU kernel variants clattn builds (FILE<TAB>OPTIONS, one per clBuildProgram), as"
    echo "# recorded by tests/resources/capture.sh under Oclgrind (CLATTN_PARAMS=gpu, 48 KiB of"
    echo "# local memory). Regenerate:" \
        "tests/resources/capture.sh BUILD tests/resources/variants.txt"
    sort -u "$log"
} >"$out"
