#!/usr/bin/env bash
# tests/gpu_model/run.sh BUILD_DIR [model.py options]
#
# The GPU work model's check (tests/gpu_model/README.md): runs BUILD_DIR/gpu_model_driver under
# `oclgrind --inst-counts --local-mem-size 49152` with CLATTN_PARAMS=gpu on each shape of
# tests/gpu_model/model.py, and compares the counts (global and local loads and stores,
# barriers, FMAs, exps per kernel launch) with the closed-form formulas there. Prints the table
# and exits 1 on any mismatch, naming the counter and both numbers: a kernel whose traffic
# changed fails until its formula is updated with the change, on purpose.
#
# Before that, a canary checks the checker: a scratch copy of the kernels (CLATTN_KERNEL_DIR)
# with one extra local load per weight in flash_gpu.cl's O += P V loop (a volatile load whose
# value is discarded: the numbers do not change, the traffic does) must be failed on
# local_loads; and a scratch flash_bwd.cl with one extra global load of the q row per (pair,
# dim) in bwd_dkdv's dK loop must be failed on global_loads.
# GPU_MODEL_CANARY=0 skips them.
# Exit status: 0 when everything matched and the canary was caught; 1 otherwise; 2 bad usage,
# no oclgrind or python3, a driver that failed.
set -u
# The model counts a plan's own launches: self-validation's probes (first use) would add theirs.
export CLATTN_VALIDATE=off
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [model.py options]" >&2; exit 2; }
build_dir=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: no build folder '$1'" >&2; exit 2; }
shift
here=$(cd "$(dirname "$0")" && pwd)
for tool in oclgrind python3; do
    command -v "$tool" >/dev/null || { echo "$0: $tool not found" >&2; exit 2; }
done
start=$(date +%s)
failed=0

# The planted kernels in $scratch/kernels: $1 the file, $2 its kernel, $3 the counter the
# planted load must fail, $4 the model's case, $5 what was planted. Expects model.py's exit 1
# and a mismatch of that counter; sets failed=1 otherwise.
canary_check() {
    if ! grep -q 'canary' "$scratch/kernels/$1"; then
        echo "gpu_model canary: FAILED: cannot plant the extra load ($1 changed?):" \
             "update tests/gpu_model/run.sh"
        failed=1
        return
    fi
    python3 "$here/model.py" "$build_dir" --kernels "$scratch/kernels" --case "$4" \
        >"$scratch/canary.out" 2>&1
    status=$?
    if [ "$status" -eq 1 ] && grep -q "$2 $3: measured" "$scratch/canary.out"; then
        echo "gpu_model canary: ok: an extra $5 in $2 ($1) is failed" \
             "($(grep -m1 "$2 $3: measured" "$scratch/canary.out" | sed 's/^ *//'))"
    else
        echo "gpu_model canary: FAILED: model.py exit $status on a planted extra $5 in $2;" \
             "expected exit 1 and a $3 mismatch"
        tail -n 20 "$scratch/canary.out"
        failed=1
    fi
}

if [ "${GPU_MODEL_CANARY:-1}" != 0 ]; then
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu_model.XXXXXX") || exit 2
    cp -r "$here/../../kernels" "$scratch/kernels"
    # With the weights' float4 load in the O += P V loop, a volatile load of the same words
    # whose value is discarded: the compiler must keep it, and no number changes.
    weight='p4\[i\] = p_tile4\[(ty + i \* FG_TY) \* (P_PAD \/ 4) + j4\];'
    extra='(void)((volatile __local float4 *)p_tile4)[(ty + i * FG_TY) * (P_PAD \/ 4) + j4];'
    sed -i "s/^\( *\)$weight\$/\1{ p4[i] = p_tile4[(ty + i * FG_TY) * (P_PAD \/ 4) + j4]; $extra \/* canary *\/ }/" \
        "$scratch/kernels/flash_gpu.cl"
    canary_check flash_gpu.cl flash_attention local_loads \
        "decode grouped H8/2 kvlen 37/80 d64" "local load"
    # The backward: an extra (volatile, discarded) global load of a row's lse per row tile of
    # bwd_dkdv_gpu (flash_bwd_gpu.cl, what GPUs run) must be failed on global_loads.
    cp "$here/../../kernels/flash_bwd_gpu.cl" "$scratch/kernels/flash_bwd_gpu.cl"
    tile='const uint rows = min((uint)BG_BR, last - row0);'
    extra='(void)((volatile __global const float *)lse_in)[lse_base];'
    sed -i "s/^\( *\)$tile\$/\1$tile $extra \/* canary *\//" \
        "$scratch/kernels/flash_bwd_gpu.cl"
    canary_check flash_bwd_gpu.cl bwd_dkdv_gpu global_loads "backward GQA H2/1 12x20 d24" \
        "global load"
    rm -rf "$scratch"
fi

python3 "$here/model.py" "$build_dir" "$@"
status=$?
[ "$status" -eq 0 ] || failed=$status

# Smoke run of the GPU time model (bench/gpu_model.py imports model.py's formulas): a change
# of their interface fails here instead of leaving the script to rot. No Oclgrind needed.
if ! python3 "$here/../../bench/gpu_model.py" --markdown >/dev/null; then
    echo "gpu_model: bench/gpu_model.py --markdown FAILED (the time model no longer runs" \
         "on these formulas)"
    [ "$failed" -ne 0 ] || failed=1
fi
echo "gpu_model: $(($(date +%s) - start)) s in all"
exit "$failed"
