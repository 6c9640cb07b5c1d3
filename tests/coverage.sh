#!/usr/bin/env bash
# Line and branch coverage of the library (host/) and of the command and file formats (tools/)
# by the ctest suite.
#
#   tests/coverage.sh BUILD_DIR [CTEST_ARGS...]
#
# Configures BUILD_DIR with -DCLATTN_COVERAGE=ON (gcc --coverage -O0 -g, Debug), builds it,
# clears old counters, runs ctest (CTEST_ARGS are passed on, e.g. -R 'errors|runtime'), then
# captures the counters with lcov (branch coverage on) and prints, for host/ and for tools/, the
# lines and branches hit per file and in total. The tracefiles are left in BUILD_DIR/coverage/
# (host.info, tools.info); `genhtml --branch-coverage -o OUT BUILD_DIR/coverage/host.info`
# makes an annotated HTML copy of the sources. The fault-injection build of the library
# (check_fault) counts too: it is the same source. Exit status: ctest's when it failed,
# otherwise lcov's; 2 on bad usage.
#
# Needs gcc, gcov and lcov (Debian 12: lcov 1.16). Environment: JOBS (default: nproc).
set -uo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [CTEST_ARGS...]" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/.." && pwd)
build_dir=$1
shift
jobs=${JOBS:-$(nproc)}
rc_opts=(--rc lcov_branch_coverage=1)

cmake -S "$source_dir" -B "$build_dir" -DCLATTN_COVERAGE=ON -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_C_COMPILER=gcc >/dev/null || exit 1
cmake --build "$build_dir" -j "$jobs" >/dev/null || exit 1
build_dir=$(cd "$build_dir" && pwd)
out="$build_dir/coverage"
mkdir -p "$out"
lcov --quiet --zerocounters --directory "$build_dir" || exit 1

(cd "$build_dir" && ctest --output-on-failure "$@")
test_rc=$?

lcov --quiet "${rc_opts[@]}" --capture --directory "$build_dir" --base-directory "$source_dir" \
     --output-file "$out/all.info" || exit 1
lcov --quiet "${rc_opts[@]}" --extract "$out/all.info" "$source_dir/host/*" \
     --output-file "$out/host.info" || exit 1
lcov --quiet "${rc_opts[@]}" --extract "$out/all.info" "$source_dir/tools/*" \
     --output-file "$out/tools.info" || exit 1

# One row per file from the tracefile's LF/LH (lines) and BRF/BRH (branches) records.
summarise() {
    awk -v root="$source_dir/" -v title="$1" '
        function pct(hit, found) { return found ? sprintf("%6.1f%%", 100 * hit / found) : "     -" }
        function row(name, lh, lf, bh, bf) {
            printf "%-24s %6d/%-6d %s   %6d/%-6d %s\n", name, lh, lf, pct(lh, lf), bh, bf,
                   pct(bh, bf)
        }
        BEGIN { printf "\n%-24s %20s   %20s\n", title, "lines", "branches" }
        /^SF:/ { file = substr($0, 4); sub(root, "", file); lf = lh = bf = bh = 0 }
        /^LF:/ { lf = substr($0, 4) }
        /^LH:/ { lh = substr($0, 4) }
        /^BRF:/ { bf = substr($0, 5) }
        /^BRH:/ { bh = substr($0, 5) }
        /^end_of_record/ {
            row(file, lh, lf, bh, bf)
            tlf += lf; tlh += lh; tbf += bf; tbh += bh
        }
        END { row("total", tlh, tlf, tbh, tbf) }' "$2"
}
summarise "host/" "$out/host.info"
summarise "tools/" "$out/tools.info"

if [ "$test_rc" -ne 0 ]; then
    echo "coverage.sh: ctest failed (exit $test_rc); the figures cover the tests that ran" >&2
    exit "$test_rc"
fi
exit 0
