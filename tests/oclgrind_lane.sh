#!/usr/bin/env bash
# tests/oclgrind_lane.sh BUILD_DIR [SUITE...]
#
# The Oclgrind lane: the check suites that exercise kernels, run under the Oclgrind simulator
# (Debian `oclgrind`) with data-race detection and API checking, with clattn's GPU-class kernel
# parameters (tiled matmul, 256-wide softmax reductions, scalar fused kernel): the code paths a
# real GPU takes. Oclgrind runs work-items one by one and reports data races, barrier
# divergence, out-of-bounds accesses and API misuse; every GPU variant of every kernel must run
# clean there (see DESIGN.md). The parameters are forced with CLATTN_PARAMS=gpu: Oclgrind 21.10
# reports CL_DEVICE_TYPE = 15 (CPU | GPU | ACCELERATOR | DEFAULT), which clattn would take for
# a CPU. OCLGRIND_LANE_PARAMS=cpu runs the CPU-class variants instead (vector matmul, transpose,
# 4-wide softmax, float4/float8 fused kernel).
#
# A suite FAILS when its tests fail, when it did not run on the Oclgrind device, or when
# Oclgrind reported anything, even if every number passed: its reports go to stderr, which is
# grepped for their markers. (Not --log: Oclgrind reopens, i.e. truncates, that file for each
# OpenCL context, and its --check-api reports do not go there.)
#
# check_runtime runs its "queues" test case only: the "contexts" case calls OpenCL from several
# host threads at once, which Oclgrind's runtime does not support (jrprice/Oclgrind#28: wrong
# results), and provokes API errors on purpose (broken kernel sources).
#
# Suites run with CLATTN_TEST_SCALE=small: the suites leave their heaviest cases (300^3
# products, a sequence of 8192, the fused kernel on 65542 heads, ...) unregistered and print
# one "NOT RUN" line saying which and why; every kernel and kernel variant still runs.
#
# The suites run with CLATTN_VALIDATE=off (each new variant's first-use probe would run in the
# simulator too); after them, `clattn doctor` probes every variant of the GPU parameters
# against float64 under the same race and API checks (OCLGRIND_LANE_DOCTOR=0 skips it).
#
# Before the suites, a canary checks the checker: a scratch copy of the kernels with a
# deliberate write-write race in softmax_rows (loaded through CLATTN_KERNEL_DIR) must pass
# its numbers and still be failed by the lane. OCLGRIND_LANE_CANARY=0 skips it.
#
# Environment: OCLGRIND_LANE_TIMEOUT (seconds per suite, default 1200), OCLGRIND_LANE_LOGS
# (folder for the logs; default a temporary folder, removed when everything passed).
# Output: one line per suite with its time, a closing line "N passed, N failed" counting
# suites; exit status 0 only when every suite passed (2: bad usage or no oclgrind).
set -u

usage() {
    echo "usage: $0 BUILD_DIR [SUITE...]" \
         "(suites: softmax matmul attention mha flash plan runtime posenc rope additive sweep" \
         "backward dropout flex commit paged decode_step mixed mla fp8 merge;" \
         "mpi: check_mpi on 2 ranks under mpirun, each under Oclgrind (-DCLATTN_MPI=ON))" >&2
    exit 2
}
[ $# -ge 1 ] || usage
build_dir=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: no build folder '$1'" >&2; exit 2; }
shift
suites=("${@#check_}")
[ ${#suites[@]} -gt 0 ] ||
    suites=(softmax matmul attention mha flash plan runtime posenc rope additive sweep backward
            dropout flex commit paged decode_step mixed mla fp8 merge)
if ! command -v oclgrind >/dev/null; then
    echo "$0: oclgrind not found (apt-get install oclgrind)" >&2
    exit 2
fi
source_dir=$(cd "$(dirname "$0")/.." && pwd)
timeout_s=${OCLGRIND_LANE_TIMEOUT:-1200}
launcher=() # a command that starts the program (mpirun for the mpi suite), else none
# Race detection and API checking in one pass over each suite. OCLGRIND_LANE_CHECKS adds
# others, e.g. "--data-races --uninitialized --check-api": uninitialised-value tracking runs
# clean on every kernel (both parameter classes) but made the softmax suite alone take 615 s
# on this 2-core machine, so it is not in CI. It needs kernels without LLVM `freeze`
# (Oclgrind 21.10's checker aborts on it: hence the remainders written as x - (x / y) * y in
# the kernels) and host writes at offset 0 (21.10 marks a clEnqueueWriteBuffer at a nonzero
# offset as if it started at 0, so reads of the range written are reported; the host API
# stages its parameters in one write from 0).
oclgrind_checks=${OCLGRIND_LANE_CHECKS:---data-races --check-api}
params=${OCLGRIND_LANE_PARAMS:-gpu}
if [ "$params" != gpu ] && [ "$params" != cpu ]; then
    echo "$0: OCLGRIND_LANE_PARAMS must be gpu or cpu, not '$params'" >&2
    exit 2
fi

if [ -n "${OCLGRIND_LANE_LOGS:-}" ]; then
    logs=$OCLGRIND_LANE_LOGS
    mkdir -p "$logs" || exit 2
    keep_logs=1
else
    logs=$(mktemp -d "${TMPDIR:-/tmp}/oclgrind_lane.XXXXXX") || exit 2
    keep_logs=0
fi

# What Oclgrind prints when it finds something: races ("Read-write data race at local memory
# address ..."), "Invalid read of size 4 at global memory address ...", "Work-group divergence
# detected (barrier)", --check-api's "Oclgrind - OpenCL runtime error detected", its own
# failures ("[Oclgrind] ...") and "1000 errors generated - suppressing further errors".
markers='data race|Invalid (read|write)|divergence detected|runtime error detected'
markers+='|[Uu]ninitiali[sz]ed value|[Uu]naligned|suppressing further errors|\[Oclgrind\]'
markers+='|Oclgrind - |FATAL ERROR|Unsupported instruction'

# run_one NAME OUT_PREFIX [ENV=VALUE...] -- COMMAND...: runs COMMAND under oclgrind, its
# stdout and stderr in OUT_PREFIX.out, check's per-test results and durations in
# OUT_PREFIX.xml; sets status (the command's exit status) and findings
# (lines of Oclgrind reports, 0 when clean), and prints the first report when there is one.
run_one() {
    local name=$1 prefix=$2
    shift 2
    local env=()
    while [ "$1" != "--" ]; do env+=("$1"); shift; done
    shift
    env CLATTN_TEST_SCALE=small CLATTN_PARAMS="$params" CK_FORK=no CLATTN_VALIDATE=off \
        CK_XML_LOG_FILE_NAME="$prefix.xml" "${env[@]}" \
        timeout "$timeout_s" "${launcher[@]}" oclgrind $oclgrind_checks "$@" >"$prefix.out" 2>&1
    status=$?
    findings=$(grep -Ec "$markers" "$prefix.out")
    if [ "$findings" -ne 0 ]; then
        local races invalid divergence api
        races=$(grep -c 'data race' "$prefix.out")
        invalid=$(grep -Ec 'Invalid (read|write)' "$prefix.out")
        divergence=$(grep -c 'divergence detected' "$prefix.out")
        api=$(grep -c 'runtime error detected' "$prefix.out")
        echo "  $name: OCLGRIND REPORTED ERRORS: $races data race(s), $invalid invalid" \
             "access(es), $divergence divergence(s), $api API error(s); the first report" \
             "(all in $prefix.out):"
        grep -m1 -En "$markers" "$prefix.out" | cut -d: -f1 | {
            read -r first && tail -n "+$first" "$prefix.out" | head -n 16 | sed 's/^/    | /'
        }
    fi
}

now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

echo "oclgrind lane: $(oclgrind --version | grep -m1 Oclgrind), CLATTN_PARAMS=$params," \
     "build $build_dir, logs $logs"
lane_start=$(now)
failed_any=0

# --- the canary: the checker must catch a race whose numbers pass -------------------------
if [ "${OCLGRIND_LANE_CANARY:-1}" != 0 ]; then
    canary_dir="$logs/canary_kernels"
    rm -rf "$canary_dir"
    cp -r "$source_dir/kernels" "$canary_dir"
    # After softmax_rows' last loop every work-item writes its own id to scratch[0], which
    # nothing reads again: a write-write race that leaves every result as it was. The suite's
    # "numerics" case is enough (7 tests, 26 s here; "masks" took 62 s): Oclgrind stops
    # printing at 1000 race reports either way.
    sed -i '/^        out\[c\] \*= inv;$/a\    scratch[0] = (float)lid; /* canary race */' \
        "$canary_dir/softmax.cl"
    start=$(now)
    if ! grep -q 'canary race' "$canary_dir/softmax.cl"; then
        echo "canary: FAILED: cannot plant the race (softmax.cl changed?): update this script"
        failed_any=1
    elif [ ! -x "$build_dir/check_softmax" ]; then
        echo "canary: FAILED: $build_dir/check_softmax missing"
        failed_any=1
    else
        run_one canary "$logs/canary" CLATTN_KERNEL_DIR="$canary_dir" CK_RUN_CASE=numerics -- \
            "$build_dir/check_softmax" >"$logs/canary.lane"
        races=$(grep -c 'data race' "$logs/canary.out")
        if [ "$status" -eq 0 ] && [ "$findings" -gt 0 ] && [ "$races" -gt 0 ]; then
            echo "canary: ok: a planted race with passing numbers is failed by the lane" \
                 "($races race report(s), $(seconds_since "$start") s)"
        else
            echo "canary: FAILED: planted race: suite exit $status, $findings Oclgrind" \
                 "finding(s), $races race report(s); expected exit 0 and race reports"
            cat "$logs/canary.lane"
            tail -n 20 "$logs/canary.out"
            failed_any=1
        fi
    fi
fi

# --- the suites ----------------------------------------------------------------------------
passed=0
failed=0
for suite in "${suites[@]}"; do
    program="$build_dir/check_$suite"
    if [ ! -x "$program" ]; then
        echo "$suite: FAILED: $program missing"
        failed=$((failed + 1))
        continue
    fi
    extra=()
    [ "$suite" = runtime ] && extra=(CK_RUN_CASE=queues)
    # flex: the numbers (its "errors" case builds a bad source on purpose, which Oclgrind's
    # API check reports)
    [ "$suite" = flex ] && extra=(CK_RUN_CASE=numbers)
    launcher=() # mpi: two ranks, each under its own Oclgrind (the ring's merge and sub-plans)
    [ "$suite" = mpi ] &&
        launcher=(mpirun --allow-run-as-root --oversubscribe -np 2 -x CLATTN_TEST_SCALE
                  -x CLATTN_PARAMS -x CK_FORK -x CK_XML_LOG_FILE_NAME)
    start=$(now)
    run_one "$suite" "$logs/$suite" "${extra[@]}" -- "$program"
    elapsed=$(seconds_since "$start")
    reasons=()
    if [ "$status" -eq 124 ]; then
        reasons+=("timed out after $timeout_s s")
    elif [ "$status" -ne 0 ]; then
        reasons+=("exit status $status")
    fi
    grep -q "device Oclgrind" "$logs/$suite.out" || reasons+=("did not run on the Oclgrind device")
    [ "$findings" -eq 0 ] || reasons+=("$findings Oclgrind report line(s)")
    checks=$(grep -Eo '^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' \
                 "$logs/$suite.out")
    if [ ${#reasons[@]} -eq 0 ]; then
        echo "$suite: passed in $elapsed s (${checks:-no check summary})"
        passed=$((passed + 1))
    else
        echo "$suite: FAILED in $elapsed s: $(IFS=';'; echo "${reasons[*]}")" \
             "(${checks:-no check summary})"
        grep -E ':[FE]:|FAIL|NO OPENCL' "$logs/$suite.out" | head -n 10 | sed 's/^/    /'
        failed=$((failed + 1))
    fi
    grep 'NOT RUN' "$logs/$suite.out" | sed 's/^/    /'
    [ "$suite" = runtime ] && echo "    runtime: NOT RUN: the 'contexts' test case (host" \
        "threads: Oclgrind's runtime is not thread-safe; deliberate API errors)"
done

# --- clattn doctor: every GPU variant's probe, under the race and API checks ----------------
if [ "${OCLGRIND_LANE_DOCTOR:-1}" != 0 ]; then
    start=$(now)
    run_one doctor "$logs/doctor" CLATTN_VALIDATE=first-use \
        CLATTN_VALIDATION_FILE="$logs/doctor.records" -- \
        "$build_dir/clattn" doctor --json "$logs/doctor.json"
    summary=$(grep -o 'all [0-9]* variants passed' "$logs/doctor.out")
    if [ "$status" -eq 0 ] && [ "$findings" -eq 0 ] && [ -n "$summary" ]; then
        echo "doctor: passed in $(seconds_since "$start") s ($summary)"
        passed=$((passed + 1))
    else
        echo "doctor: FAILED in $(seconds_since "$start") s: exit status $status, $findings" \
             "Oclgrind report line(s)"
        grep -E 'FAILED|clattn doctor' "$logs/doctor.out" | head -n 10 | sed 's/^/    /'
        failed=$((failed + 1))
    fi
fi

echo "oclgrind lane: $(seconds_since "$lane_start") s in all"
[ "$failed_any" -eq 0 ] || echo "the canary FAILED: Oclgrind's reports would go unnoticed"
echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ] || [ "$failed_any" -ne 0 ]; then
    echo "logs kept in $logs"
    exit 1
fi
[ "$keep_logs" -eq 1 ] || rm -rf "$logs"
exit 0
