#!/usr/bin/env bash
# tests/resources/run.sh [--table FILE] [--maxrregcount N] [--budgets FILE] [--no-amd] ...
#
# The resource lane (manual, and in `tests/all_lanes.sh --full`; not in the CI tier, which
# runs on a fresh machine without the CUDA toolkit): registers, stack, spills and shared
# memory of every GPU kernel variant clattn builds, by proxy, since no GPU is lent to the
# project. resources.py does the work (--help lists its options); this wrapper only finds
# python3.
#
# Pipeline, per line of variants.txt (FILE<TAB>OPTIONS, recorded from clBuildProgram by
# capture.sh under Oclgrind with CLATTN_PARAMS=gpu and 48 KiB of local memory):
#   common.cl + types.cl + params.h + score.cl + FILE (as host/core/programs.c concatenates them)
#     -> clang-15 -x cl -target nvptx64-unknown-nvidiacl -O3 OPTIONS (OpenCL C 1.2)
#     -> llvm-link-15 --internalize --only-needed with libclc-15's nvptx64--nvidiacl.bc
#        (its builtins become internal, so they inline; clang 14 cannot read LLVM 15 bitcode)
#     -> opt-15 -O3 -> llc-15 -mcpu=sm_80 (LLVM 15 knows no sm_90) -> PTX 7.5
#     -> ptxas -v -arch=sm_90 (/usr/local/cuda/bin/ptxas or PATH)
#   and for AMD: the same with -target amdgcn-unknown-amdhsa -mcpu=gfx90a and libclc's
#   amdgcn--amdhsa.bc, llc -filetype=obj with the kernel-resource-usage remarks.
# It is a proxy: NVIDIA's own OpenCL compiler (NVVM) optimises differently, but ptxas, the
# register allocator, is the real one.
#
# Every kernel entry is held to the first matching line of budgets.txt (max registers, max
# stack, spills allowed or not; AMD VGPRs and VGPR spills). Exit status: 0 all within budget,
# 1 a kernel over budget or a compile failure, 77 SKIPPED (a tool is missing: it prints what),
# 2 bad usage. The committed table (tests/resources/table.md) is this script's --table output;
# the lane writes build/resources-table.md and prints it.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v python3 >/dev/null; then
    echo "resources: SKIPPED (no python3)"
    exit 77
fi
exec python3 "$here/resources.py" "$@"
