#!/usr/bin/env bash
# Every test lane of clattn, one after another, each timed; what README's test command (and so
# .ci/run) runs after installing the packages. From the repository root:
#
#   tests/all_lanes.sh [LANE...]      lanes: pocl asan fuzz rusticl oclgrind mutants (default: all)
#
#   pocl      the ctest suite on PoCL (the default device), build/
#   asan      the same suite built with ASan + UBSan (LeakSanitizer on), build-asan/, less
#             runtime_rusticl (Mesa's compiler under ASan's allocator took 441 s of the lane's
#             713; the rusticl lane runs that suite on rusticl, and the pocl lane runs it too)
#   fuzz      each libFuzzer target for FUZZ_SECONDS (default 60), build-fuzz/ (clang)
#   rusticl   the ctest suite again on Mesa's rusticl (tests/rusticl_lane.sh), build/, less the
#             entries that only change parameters or test host-side code (rusticl_skip below)
#   oclgrind  the kernel suites' reduced set under Oclgrind --data-races (tests/oclgrind_lane.sh)
#   mutants   every mutant of tests/mutants/mutants.txt must be killed (tests/mutants/run.sh)
#
# Every lane runs even when an earlier one failed (the table at the end says which); the exit
# status is 1 when any failed. The build trees share one PoCL kernel cache (build/pocl-cache),
# so each kernel variant is compiled once. Measured on the 2-core CI machine: see README.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

lanes=("$@")
[ ${#lanes[@]} -gt 0 ] || lanes=(pocl asan fuzz rusticl oclgrind mutants)
jobs=$(nproc 2>/dev/null || echo 2)
cache=$PWD/build/pocl-cache
mkdir -p "$cache"

lane_pocl() {
    cmake -S . -B build -DCLATTN_TEST_POCL_CACHE="$cache" &&
        cmake --build build -j"$jobs" &&
        (cd build && ctest --output-on-failure)
}
# The asan lane loads every installed OpenCL implementation but Clover (mesa.icd): on AMD CPUs
# Clover's gallium pipe driver (pipe_swrast.so, dlclose'd at exit) leaves 128 bytes from a
# realloc that LeakSanitizer can then name only as "<unknown module>", so no suppression by
# library can match it (measured on a Zen 3 EPYC; the Xeon runs did not show it). PoCL and
# rusticl stay loaded; clattn's own leaks are still reported (leak_canary).
lane_asan() {
    local vendors
    vendors=$(mktemp -d)
    for icd in /etc/OpenCL/vendors/*.icd; do
        [ -e "$icd" ] && [ "$(basename "$icd")" != mesa.icd ] && cp "$icd" "$vendors/"
    done
    cmake -S . -B build-asan -DCLATTN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
        -DCLATTN_TEST_POCL_CACHE="$cache" &&
        cmake --build build-asan -j"$jobs" &&
        (cd build-asan && OCL_ICD_VENDORS="$vendors" ctest --output-on-failure -E '^runtime_rusticl$')
    local status=$?
    rm -rf "$vendors"
    return $status
}
lane_fuzz() {
    CC=clang cmake -S . -B build-fuzz -DCLATTN_FUZZ=ON -DCLATTN_BUILD_TESTS=OFF &&
        cmake --build build-fuzz -j"$jobs" &&
        tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-60}"
}
ensure_build() {
    cmake -S . -B build -DCLATTN_TEST_POCL_CACHE="$cache" >/dev/null &&
        cmake --build build -j"$jobs" >/dev/null
}
# On rusticl every kernel variant is compiled by Mesa (clang -> SPIR-V -> NIR -> gallivm), which
# is slow; the lane runs each suite with the parameters rusticl gets (and the default row, and the
# forced key splits), not the variants the pocl lane already runs with other parameters.
rusticl_skip='_(tiled|gpu_params|tuned)$|^(tune|cli|io|fault|install_package|textbook_example|threads|runtime_rusticl)$'
lane_rusticl() { ensure_build && tests/rusticl_lane.sh build -E "$rusticl_skip"; }
lane_oclgrind() { ensure_build && tests/oclgrind_lane.sh build; }
lane_mutants() { ensure_build && tests/mutants/run.sh build; }

names=() results=() times=()
failed=0
total_start=$(date +%s)
for lane in "${lanes[@]}"; do
    if ! declare -F "lane_$lane" >/dev/null; then
        echo "all_lanes: unknown lane '$lane' (pocl asan fuzz rusticl oclgrind mutants)" >&2
        exit 2
    fi
    echo
    echo "=== lane $lane ==="
    start=$(date +%s)
    if "lane_$lane"; then result=passed; else result=FAILED; failed=$((failed + 1)); fi
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
echo "lanes: $((${#names[@]} - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
