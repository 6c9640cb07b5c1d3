#!/usr/bin/env bash
# Runs the libFuzzer targets for a bounded time each and fails on any finding.
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]      fuzz each target SECONDS (default 60)
#   tests/fuzz/run.sh --replay FUZZER DIR...   run every file in the DIRs once (ctest uses it)
#
# BUILD_DIR is a build configured with -DCMAKE_C_COMPILER=clang -DCLATTN_FUZZ=ON (the fuzzers
# are in BUILD_DIR/tests/fuzz, or directly in BUILD_DIR). Each target fuzzes a scratch copy of
# its committed corpus (tests/fuzz/corpus/<target>, left untouched) plus the saved crashes of
# tests/fuzz/regressions/<target> (read only). Per target it prints the executions done (from
# libFuzzer's final "Done N runs" line). A target fails when it exits non-zero or leaves a
# crash-, leak-, timeout- or oom- file; those files and the full log are kept in
# BUILD_DIR/fuzz-findings/<target>/ and the end of the log is printed. Exit status: 0 when no
# target failed, 1 otherwise, 2 on bad usage.
#
# Environment: FUZZ_TARGETS (default "npy safetensors cli_args"), FUZZ_EXTRA_ARGS (more
# libFuzzer options, e.g. -jobs=2), CLATTN_FUZZ_FIXTURES (the source tree whose fixture files
# fuzz_cli_args passes to `clattn run`; default: this one).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
export CLATTN_FUZZ_FIXTURES=${CLATTN_FUZZ_FIXTURES:-$source_dir}
# Stack traces for UBSan reports; ASan's leak check is on by default on Linux.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

if [ "${1:-}" = "--replay" ]; then
  [ $# -ge 3 ] || { echo "usage: $0 --replay FUZZER DIR..." >&2; exit 2; }
  fuzzer=$2
  shift 2
  inputs=()
  for dir in "$@"; do
    [ -d "$dir" ] || continue
    for file in "$dir"/*; do
      [ -f "$file" ] && inputs+=("$file")
    done
  done
  if [ ${#inputs[@]} -eq 0 ]; then
    echo "$0: no inputs in $*"
    exit 0
  fi
  echo "$0: replaying ${#inputs[@]} inputs through $fuzzer"
  exec "$fuzzer" "${inputs[@]}"
fi

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BUILD_DIR [SECONDS]   or   $0 --replay FUZZER DIR..." >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd) || exit 2
seconds=${2:-60}
case $seconds in
  '' | *[!0-9]*) echo "$0: SECONDS must be a whole number, not '$seconds'" >&2; exit 2 ;;
esac

scratch=$(mktemp -d "${TMPDIR:-/tmp}/clattn-fuzz-run.XXXXXX") || exit 2
trap 'rm -rf "$scratch"' EXIT

failed=0
summary=()
for target in ${FUZZ_TARGETS:-npy safetensors cli_args}; do
  fuzzer=
  for candidate in "$build_dir/tests/fuzz/fuzz_$target" "$build_dir/fuzz_$target"; do
    if [ -x "$candidate" ]; then
      fuzzer=$candidate
      break
    fi
  done
  if [ -z "$fuzzer" ]; then
    echo "$0: no fuzz_$target in $build_dir (configure with -DCLATTN_FUZZ=ON)" >&2
    summary+=("$(printf '%-18s missing' "fuzz_$target")")
    failed=1
    continue
  fi
  work=$scratch/$target
  mkdir -p "$work/corpus" "$work/artifacts"
  cp -R "$here/corpus/$target/." "$work/corpus/"
  corpora=("$work/corpus")
  [ -d "$here/regressions/$target" ] && corpora+=("$here/regressions/$target")
  echo "== fuzz_$target: ${seconds} s"
  # shellcheck disable=SC2086 # FUZZ_EXTRA_ARGS is a list of options
  "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 ${FUZZ_EXTRA_ARGS:-} \
    "${corpora[@]}" >"$work/log" 2>&1
  status=$?
  runs=$(sed -n 's/^Done \([0-9][0-9]*\) runs.*/\1/p' "$work/log" | tail -n 1)
  # after a crash there is no "Done" line, but -print_final_stats still counts
  [ -n "$runs" ] || runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/log" | tail -n 1)
  findings=$(find "$work/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' \
             -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
  if [ $status -ne 0 ] || [ -n "$findings" ]; then
    failed=1
    keep=$build_dir/fuzz-findings/$target
    mkdir -p "$keep"
    cp "$work/log" "$keep/log"
    if [ -n "$findings" ]; then
      while IFS= read -r file; do cp "$file" "$keep/"; done <<<"$findings"
    fi
    echo "fuzz_$target FAILED (exit status $status); log and inputs in $keep:"
    ls "$keep"
    tail -n 60 "$work/log"
    summary+=("$(printf '%-18s FAILED after %s runs (exit status %d), see %s' "fuzz_$target" \
                "${runs:-?}" "$status" "$keep")")
  else
    corpus_size=$(find "$work/corpus" -type f | wc -l)
    summary+=("$(printf '%-18s %10s runs in %s s, corpus %d inputs, peak RSS %s MB, no findings' \
                "fuzz_$target" "${runs:-?}" "$seconds" "$corpus_size" "${rss:-?}")")
  fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
# The closing line CI reads: targets that ran clean vs. targets that failed or were missing.
bad=0
for line in "${summary[@]}"; do
  case "$line" in *"no findings") ;; *) bad=$((bad + 1)) ;; esac
done
echo "fuzz: $(( ${#summary[@]} - bad )) passed, $bad failed"
exit $failed
