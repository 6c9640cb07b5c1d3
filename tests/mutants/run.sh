#!/usr/bin/env bash
# Mutation testing: plants each bug of tests/mutants/mutants.txt in turn and checks that the test
# suites listed for it fail ("kill" it).
#
#   tests/mutants/run.sh [BUILD_DIR] [MUTANT_ID...] [--timeout S] [--list] [--no-build]
#
# BUILD_DIR (default: build) is a configured build of this tree with the tests (the default
# CMake options); it is brought up to date first (--no-build skips that). Then:
#   1. baseline: every suite some mutant lists runs once unmutated in BUILD_DIR; all must pass.
#      This also warms the PoCL kernel cache, and the times order the suites (cheapest first)
#      and set each suite's timeout (4 x baseline + 30 s, at least 60 s; --timeout overrides).
#   2. kernel mutants (kernels/*.cl): a temp copy of kernels/ with the mutation applied, and the
#      listed suites run in BUILD_DIR with CLATTN_KERNEL_DIR pointing at it (no rebuild).
#   3. host mutants (host/*.c): a scratch copy of the tree in BUILD_DIR/mutants/src (only changed
#      files are copied, so it stays incremental between runs), configured once in
#      BUILD_DIR/mutants/build (-DCLATTN_BUILD_EXAMPLES=OFF, Ninja when present, PoCL cache shared
#      with BUILD_DIR); per mutant the previous mutant's file is restored, the new one is
#      mutated and the build is rebuilt incrementally, then the listed suites run there.
# Per mutant the suites run one at a time (ctest -R '^suite$', the tests' own CI environment:
# CK_FORK=no, POCL_CACHE_DIR=<build>/pocl-cache) and stop at the first that fails. A suite that
# times out runs once more with twice the time: a kernel mutant's first run compiles all the
# suite's programs cold (check_flash: minutes), and those compiled before the kill are cached.
#
# Results: KILLED by <suite>, KILLED (timeout) by <suite> (both runs timed out), SURVIVED (<suites run>), DOES NOT
# APPLY (the original text occurs 0 or 2+ times, or a tests pattern matches no ctest entry),
# DOES NOT BUILD (a host mutant that does not compile), INVALID (a kernel mutant that does not
# compile: killing it proves nothing). Then `N passed, N failed` (passed = killed) and the total
# wall time. Exit status 0 when every mutant was killed, 1 otherwise, 2 on a setup error (bad
# mutants.txt, a suite failing with no mutant). Logs: BUILD_DIR/mutants/logs/<id>.log.
# About 10 minutes on a 2-core PoCL machine for the whole list.
#
# Adding a mutant: append a stanza to mutants.txt --
#
#   [x-my-bug]
#   desc: one line saying what the bug is
#   file: kernels/softmax.cl                  (or host/<file>.c)
#   tests: softmax attention                  (ctest entries expected to kill it; regexes)
#   original: exact text from the file        (must occur exactly once in the file)
#   replace: the buggy text
#
# Multi-line text: `original: <<END`, the lines, then a line `END` (same for replace). Several
# original/replace pairs make one mutant of several edits. Copy the original from the file
# (whitespace matters), keep it short but unique, and check with
# `tests/mutants/run.sh build x-my-bug` that it applies and is killed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec python3 "$here/run.py" "$@"
