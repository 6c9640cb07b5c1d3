#!/usr/bin/env bash
# Every test lane of clattn, one after another, each timed; what README's test command (and so
# .ci/run) runs after installing the packages. From the repository root:
#
#   tests/all_lanes.sh [--full] [LANE...]
#         lanes: pocl asan fuzz rusticl oclgrind onnx python mutants resources (default: pocl
#         asan fuzz rusticl oclgrind onnx python; with --full, all nine)
#
# Two tiers. The default is the CI tier, sized to stay under 40 minutes on the 2-core CI machine
# (the times are in docs/testing.md); --full runs every lane at full scale (about 2.5 hours there).
# The ctest lanes (pocl, asan, rusticl) run $(nproc) entries at a time: a suite alone leaves a
# core idle while it compiles kernels or computes its float64 references on one thread, and
# no entry shares a file or folder with another (temporary folders; the tune -> *_tuned order
# is a ctest fixture). Oclgrind already runs work-groups on every core.
#
#   pocl      the whole ctest suite on PoCL (the default device), build/, configured with
#             -DCLATTN_MPI=ON (ring attention: mpi_1..mpi_4 and cli_ring under mpirun
#             --oversubscribe; the rusticl lane leaves them out); every entry in both tiers
#             but backward_tuned and plan_gpu_params, in --full only (see lane_pocl).
#             CI tier: scale unset (check_flash samples a third of its CPU-kernel variant cases)
#             and PoCL's kernel optimizer off (see pocl_flags); --full: CLATTN_TEST_SCALE=full
#             for the entries without a scale of their own (the sweep's 1500 draws included)
#   asan      the ctest suite built with ASan + UBSan (LeakSanitizer on, -O2 -g), build-asan/,
#             less runtime_rusticl (Mesa's compiler under ASan's allocator took 441 s of the
#             lane's 713; the rusticl lane runs that suite on rusticl, and the pocl lane runs it
#             too). Only PoCL's ICD is loaded (see lane_asan). CI tier: CLATTN_TEST_SCALE=small,
#             and not the entries that rerun a suite with other kernel parameters (_tiled,
#             _gpu_params, _default_tuning, _split, _tuned): they run the same host code as their
#             suite, which is what the sanitizers instrument (PoCL's kernels are not). Except
#             flash_gpu_params: the GPU fused kernels' launch code (flash.c's argument list for
#             flash.cl/flash_gpu.cl once overran its array, unseen by the CI tier); 30 s.
#   fuzz      each libFuzzer target for FUZZ_SECONDS (default 60; CI tier 20), build-fuzz/ (clang)
#   rusticl   the ctest suite again on Mesa's rusticl (tests/rusticl_lane.sh), build/, less the
#             entries that only change parameters or test host-side code (rusticl_skip below);
#             CI tier: CLATTN_TEST_SCALE=small and not flash_cpu_split, backward,
#             backward_split or validate (the suites' plans still self-validate there; every forward kernel variant still compiles and runs through Mesa;
#             the pocl lane runs the heavy cases, the pocl and oclgrind lanes the backward),
#             nor (issue 50, to keep the tier under 40 minutes) the _default_tuning entries
#             (the default row: the pocl lane runs them), cli_doctor (339 s on rusticl in the
#             fresh-clone run of 2026-12-07: two doctor runs, every fused variant built twice
#             through Mesa; the pocl lane runs it in both tiers, Oclgrind's lane runs `clattn
#             doctor`), and fp8, mla and merge: their
#             variants (every FP8 code through three kernels, head size 576, the merge and
#             the cascade's plans) compile through Mesa in --full; pocl, asan and oclgrind
#             run them in the CI tier
#   oclgrind  the kernel suites' reduced set under Oclgrind --data-races (tests/oclgrind_lane.sh);
#             CI tier: the canary and the posenc and backward suites (positional encodings,
#             the backward's GPU kernels: 260 s), flex, issue 50's serving suites at small
#             scale (commit 3 s, paged 10 s, decode_step 6 s, mixed 13 s, mla 19 s: each runs
#             the fused GPU kernel flash_gpu.cl in its own variants) and
#             sweep (6 small draws of the interaction sweep with GPU parameters: about 100 s;
#             12 in --full; 8 until issue 50); --full adds attention and flash (154 s and
#             303 s: the unfused path's tiled matmul and softmax rows, and the fused kernel's
#             own suite; moved out with issue 50 when the tier measured 51 minutes: the sweep's
#             draws run both paths with GPU parameters, the serving suites and ONNX's 93 cases
#             the fused kernel, and `clattn doctor` probes every GPU variant, all under
#             Oclgrind in the CI tier), fp8 (198 s: its 256 codes through each kernel; the pocl
#             lane runs the same on flash_gpu.cl with GPU parameters), dropout (the GPU kernels' dropout
#             masks weight by weight, 42-56 s; moved out with issue 50: its masks add no local
#             memory or barrier, and the pocl lane runs dropout_gpu_params), merge (46 s: an
#             element-wise merge and SDPA plans the other suites run), additive (about 120 s: the additive score tiles and
#             the fused kernel's additive variant, Bahdanau attention's GPU kernels) and rope
#             (72 s; both moved out on 2026-12-04, second session, when the tier measured
#             40.6 and then 43-45 minutes on a slow hour: rope.cl has no local memory or
#             barriers, and the pocl, asan and rusticl lanes run both), the mha suite (about 300 s; moved out of the CI tier on 2026-12-04 when a
#             fresh-clone run took 43 minutes: its kernels are the attention and flash suites'
#             plus mean_heads, an element-wise kernel with no local memory; the pocl, asan and
#             rusticl lanes run it), the softmax, matmul, plan and runtime suites and mpi
#             (check_mpi on 2 ranks,
#             each under Oclgrind: the ring's merge kernel and its offset sub-plans; about
#             120 s; moved out of the CI tier on 2026-12-04 when a fresh-clone run took 42
#             minutes: the pocl lane runs check_mpi on 1 to 4 ranks, and the sub-plans are the
#             SDPA kernels the attention and flash suites run under Oclgrind). Then, in both tiers, the GPU work model (tests/gpu_model/run.sh: each GPU
#             kernel's loads, stores, barriers, FMAs and exps under Oclgrind --inst-counts
#             against closed-form formulas; about 35 s of CPU)
#   onnx      ONNX's own Attention node tests (93, from the pinned onnx package in a virtual
#             environment, build/venv-onnx: needs python3-venv and PyPI) through `clattn sdpa`
#             on both paths, on PoCL and under Oclgrind (tests/onnx/run.sh); CI tier: under
#             Oclgrind the fused path only
#   python    the Python package (tests/python/run.sh): a venv build/venv-python (numpy, pytest,
#             hypothesis, ml_dtypes, pyopencl from PyPI), `pip install .` through the in-tree
#             backend from a read-only copy of the checkout, pytest on tests/python, then
#             the files that use torch on Debian's python3-torch where installed, then
#             transformers, torch.compile and the docs' torch pages on clattn with PyPI's
#             torch (tests/python/run_hf.sh, build/venv-python-hf: about 5.3 GB and 87 s on
#             the first run; CLATTN_PY_HF=0 skips it); --full then runs it again on a wheel
#             built with ASan + UBSan (CLATTN_PY_ASAN=1; in the CI tier until issue 50)
#   mutants   every mutant of tests/mutants/mutants.txt must be killed (tests/mutants/run.sh);
#             --full only (about 15 minutes: each mutant reruns the suites that should kill it)
#   resources registers, stack, spills and shared memory of every GPU kernel variant by proxy
#             (tests/resources/run.sh: clang-15 + libclc to PTX, the CUDA toolkit's
#             `ptxas -v -arch=sm_90`; clang's gfx90a back end for AMD), held to
#             tests/resources/budgets.txt: a spill where the budget says none, or registers or
#             stack above it, fails; the table goes to build/resources-table.md. --full only
#             (or by name): a fresh CI machine has no CUDA toolkit. Without ptxas, clang-15,
#             llvm-15 or libclc-15 the lane prints why and is SKIPPED: the table shows SKIPPED,
#             it counts neither as passed nor as failed, and does not fail the run. About 2 min
#
# Every lane runs even when an earlier one failed (the table at the end says which); the exit
# status is 1 when any failed. The build trees share one PoCL kernel cache (build/pocl-cache),
# so each kernel variant is compiled once. Measured on the 2-core CI machine: see docs/testing.md.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

full=0
if [ "${1:-}" = --full ]; then
    full=1
    shift
fi
lanes=("$@")
if [ ${#lanes[@]} -eq 0 ]; then
    lanes=(pocl asan fuzz rusticl oclgrind onnx python)
    [ "$full" -eq 1 ] && lanes+=(mutants resources)
fi
echo "all_lanes: $([ "$full" -eq 1 ] && echo full || echo CI) tier: ${lanes[*]}"
jobs=$(nproc 2>/dev/null || echo 2)
cache=$PWD/build/pocl-cache
mkdir -p "$cache"

# CI tier: PoCL builds every lane's kernels without optimization (-cl-opt-disable through
# POCL_EXTRA_BUILD_FLAGS; its kernel cache keys on the flags). The PoCL lanes were mostly LLVM
# optimizing kernel variants that then ran for milliseconds (perf: 85 % of a check_plan run in
# libLLVM; check_plan 315 s with a cold cache, 7 s warm; the masks case 98 s -> 19 s at -O0;
# check_flash 509 s -> 64 s; the pocl lane 969-1141 s -> 340 s; the onnx and python lanes
# +90 and +154 s when their variants were not already built optimized by the pocl lane).
# Optimized kernel code still runs in the CI tier: Oclgrind runs LLVM's -Oz pipeline on every
# kernel before interpreting it (with race detection), and the rusticl lane compiles every
# suite's variants through Mesa's optimizing LLVM back end. --full runs every lane with PoCL's
# optimizer.
pocl_flags() {
    if [ "$full" -eq 1 ]; then
        printf '%s' "${POCL_EXTRA_BUILD_FLAGS:-}"
    else
        printf '%s' "${POCL_EXTRA_BUILD_FLAGS:+$POCL_EXTRA_BUILD_FLAGS }-cl-opt-disable"
    fi
}
# CI tier: not backward_tuned (check_backward on the tune entry's cache: its records select
# the CPU backward's key blocks, which check_backward's test_backward_key_blocks and the
# sweep's cpu_tiles context run anyway; 29-67 s), nor plan_gpu_params (95 s: check_plan with
# GPU parameters at small scale, which the Oclgrind lane runs too); both in --full only.
# backward_gpu_params stays here (67 s): the asan lane's CI tier leaves it out (see lane_asan).
lane_pocl() {
    local scale= exclude='^(backward_tuned|plan_gpu_params)$'
    [ "$full" -eq 1 ] && scale=full && exclude='^$'
    cmake -S . -B build -DCLATTN_TEST_POCL_CACHE="$cache" -DCLATTN_MPI=ON &&
        cmake --build build -j"$jobs" &&
        (cd build && POCL_EXTRA_BUILD_FLAGS=$(pocl_flags) CLATTN_TEST_SCALE=$scale \
            ctest --output-on-failure -j"$jobs" -E "$exclude")
}
# The asan lane loads PoCL's ICD only (OCL_ICD_VENDORS: a folder with pocl.icd). Clover
# (mesa.icd), on AMD CPUs: its gallium pipe driver (pipe_swrast.so, dlclose'd at exit) leaves 128
# bytes from a realloc that LeakSanitizer can then name only as "<unknown module>", so no
# suppression by library can match it (measured on a Zen 3 EPYC; the Xeon runs did not show
# it). rusticl: not needed here (runtime_rusticl is left out), and one check_plan run whose
# process had it loaded ended in "Tracer caught signal 11" from LeakSanitizer's stop-the-world
# tracer after every test had passed. clattn's own leaks are still reported (leak_canary).
lane_asan() {
    local vendors scale=small
    # (CI tier: not backward_gpu_params either: 236-298 s under ASan in the fresh-clone run of
    # 847b90a, the lane's longest entry by far; the pocl lane runs it and Oclgrind's lane runs
    # check_backward with GPU parameters; --full runs it here)
    local exclude='^runtime_rusticl$|_(tiled|default_tuning|split|tuned)$|^(matmul|softmax|attention|mha|plan|flex|mixed|backward)_gpu_params$'
    if [ "$full" -eq 1 ]; then
        scale=full
        exclude='^runtime_rusticl$'
    fi
    vendors=$(mktemp -d)
    if [ -e /etc/OpenCL/vendors/pocl.icd ]; then
        cp /etc/OpenCL/vendors/pocl.icd "$vendors/"
    else
        cp /etc/OpenCL/vendors/*.icd "$vendors/" 2>/dev/null
    fi
    cmake -S . -B build-asan -DCLATTN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCLATTN_TEST_POCL_CACHE="$cache" &&
        cmake --build build-asan -j"$jobs" &&
        (cd build-asan && OCL_ICD_VENDORS="$vendors" CLATTN_TEST_SCALE=$scale \
            POCL_EXTRA_BUILD_FLAGS=$(pocl_flags) \
            ctest --output-on-failure -j"$jobs" -E "$exclude")
    local status=$?
    rm -rf "$vendors"
    return $status
}
lane_fuzz() {
    CC=clang cmake -S . -B build-fuzz -DCLATTN_FUZZ=ON -DCLATTN_BUILD_TESTS=OFF &&
        cmake --build build-fuzz -j"$jobs" &&
        tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-$([ "$full" -eq 1 ] && echo 60 || echo 20)}"
}
ensure_build() {
    cmake -S . -B build -DCLATTN_TEST_POCL_CACHE="$cache" -DCLATTN_MPI=ON >/dev/null &&
        cmake --build build -j"$jobs" >/dev/null
}
# On rusticl every kernel variant is compiled by Mesa (clang -> SPIR-V -> NIR -> gallivm), which
# is slow; the lane runs each suite with the parameters rusticl gets (and the default row, and the
# forced key splits), not the variants the pocl lane already runs with other parameters. The
# CI tier leaves out check_backward too: its 44 cases compile one backward variant each, 517 s
# on rusticl at CLATTN_TEST_SCALE=small (measured 2026-12-05); --full runs it (the pocl and
# Oclgrind lanes run it in the CI tier), and check_validate (its fault walks build each variant
# again on fresh contexts: 66 s on rusticl at small scale; the pocl and asan lanes run it, and
# every suite's plans self-validate on rusticl; cli_doctor, 339 s there, is --full's too).
rusticl_skip='_(tiled|gpu_params|tuned)$|^(tune|cli|io|fault|install_package|textbook_example|threads|runtime_rusticl|mpi_[0-9]|cli_ring|cli_backward|cli_dropout|cli_flex|cli_merge|docs)$'
lane_rusticl() {
    if [ "$full" -eq 1 ]; then
        ensure_build && tests/rusticl_lane.sh build -j"$jobs" -E "$rusticl_skip"
    else
        ensure_build && CLATTN_TEST_SCALE=small \
            tests/rusticl_lane.sh build -j"$jobs" \
                -E "$rusticl_skip|^flash_cpu_split$|^backward(_split)?$|^validate$|^(fp8|mla|merge|cli_doctor)$|_default_tuning$"
    fi
}
lane_oclgrind() {
    if [ "$full" -eq 1 ]; then
        ensure_build && tests/oclgrind_lane.sh build softmax matmul attention mha flash plan \
            runtime posenc rope additive mpi sweep backward dropout flex commit paged \
            decode_step mixed mla fp8 merge
    else
        ensure_build && CLATTN_SWEEP_DRAWS=6 tests/oclgrind_lane.sh build posenc sweep backward \
            flex commit paged decode_step mixed mla
    fi
    local status=$?
    # The GPU work model (tests/gpu_model): every GPU kernel's counts against their formulas.
    ensure_build && tests/gpu_model/run.sh build || status=1
    return "$status"
}
# CI tier: under Oclgrind the fused path only (the unfused path's GPU kernels run under
# Oclgrind in the oclgrind lane's suites, ONNX's cases on that path on PoCL here).
lane_onnx() {
    local paths=fused
    [ "$full" -eq 1 ] && paths=fused,unfused
    ensure_build && POCL_CACHE_DIR="$cache" POCL_EXTRA_BUILD_FLAGS=$(pocl_flags) \
        ONNX_OCLGRIND_PATHS=$paths tests/onnx/run.sh build
}
lane_mutants() { ensure_build && tests/mutants/run.sh build; }
# Exit status 77 (tools missing) is passed on: the loop below records the lane as SKIPPED.
lane_resources() {
    mkdir -p build && tests/resources/run.sh --table build/resources-table.md
    local status=$?
    if [ "$status" -ne 77 ] && ! cmp -s <(grep '^| `' build/resources-table.md) \
        <(grep '^| `' tests/resources/table.md); then
        echo "resources: the numbers differ from tests/resources/table.md (commit the new" \
             "table, and budgets, if the change is meant)"
    fi
    return $status
}
lane_python() {
    local flags
    flags=$(pocl_flags)
    ensure_build && POCL_CACHE_DIR="$cache" POCL_EXTRA_BUILD_FLAGS=$flags tests/python/run.sh build ||
        return 1
    # the ASan wheel's rerun: --full only since issue 50 (66 s; the asan lane instruments the
    # same C code under the C suites)
    [ "$full" -eq 1 ] || return 0
    POCL_CACHE_DIR="$cache" POCL_EXTRA_BUILD_FLAGS=$flags CLATTN_PY_ASAN=1 tests/python/run.sh build
}

names=() results=() times=()
failed=0 skipped=0
total_start=$(date +%s)
for lane in "${lanes[@]}"; do
    if ! declare -F "lane_$lane" >/dev/null; then
        echo "all_lanes: unknown lane '$lane' (pocl asan fuzz rusticl oclgrind onnx python" \
             "mutants resources)" >&2
        exit 2
    fi
    echo
    echo "=== lane $lane ==="
    start=$(date +%s)
    "lane_$lane"
    status=$?
    if [ "$status" -eq 0 ]; then
        result=passed
    elif [ "$status" -eq 77 ] && [ "$lane" = resources ]; then
        result=SKIPPED # its tools are missing: neither passed nor failed
        skipped=$((skipped + 1))
    else
        result=FAILED
        failed=$((failed + 1))
    fi
    elapsed=$(($(date +%s) - start))
    echo "=== lane $lane: $result in ${elapsed} s ==="
    names+=("$lane") results+=("$result") times+=("$elapsed")
done

echo
echo "lane        result   seconds"
for i in "${!names[@]}"; do
    printf '%-11s %-8s %7s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
done
echo "all lanes: $(($(date +%s) - total_start)) s"
echo "lanes: $((${#names[@]} - failed - skipped)) passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
