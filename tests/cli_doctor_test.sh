#!/usr/bin/env bash
# clattn doctor: on a clean device every variant passes (exit 0) and the JSON report lists each
# variant the table printed; with a fault planted in every fused kernel (CLATTN_FAULT_VARIANT=
# flash) it exits 1, its table marks a flash variant FAILED, the one-line summary goes to
# stderr, and the report's failed entries name the variant. Then `clattn sdpa` with a fault
# planted in every fused kernel's first build: the same numbers as without (the fallback),
# and one line on stderr naming the variant turned down.
# Usage: tests/cli_doctor_test.sh CLATTN_BINARY [PYTHON] (PYTHON: one with numpy, default
# /usr/bin/python3; exit 77 when no device).
set -u
cli=$1 python=${2:-/usr/bin/python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export CLATTN_VALIDATION_FILE=$dir/records
"$cli" devices >/dev/null 2>&1 || { echo "cli_doctor: no OpenCL device: skipped"; exit 77; }
fail() { echo "cli_doctor: FAILED: $*" >&2; exit 1; }

start=$(date +%s)
"$cli" doctor --json "$dir/clean.json" >"$dir/clean.out" 2>"$dir/clean.err" ||
    fail "clean run exited $? ($(tail -n 3 "$dir/clean.out" "$dir/clean.err"))"
grep -q "all [0-9]* variants passed" "$dir/clean.out" || fail "no summary: $(tail -n 2 "$dir/clean.out")"
"$python" - "$dir/clean.json" "$dir/clean.out" <<'PY' || fail "the clean report"
import json, sys
report = json.load(open(sys.argv[1]))
printed = open(sys.argv[2]).read()
variants = report["variants"]
assert variants and report["driver_key"], report
assert all(v["result"] in ("passed", "unchecked") for v in variants), variants
for v in variants:
    assert v["variant"] in printed, v["variant"]
assert all(c["outcome"] for c in report["cases"])
print(f"cli_doctor: clean: {len(variants)} variants, {len(report['cases'])} cases")
PY

CLATTN_FAULT_VARIANT=flash "$cli" doctor --json "$dir/fault.json" >"$dir/fault.out" 2>"$dir/fault.err"
status=$?
[ "$status" -eq 1 ] || fail "with a planted fault the doctor exited $status, not 1"
grep -E "flash[a-z_]*\.cl:[a-z_]+@[0-9a-f]+ +FAILED" "$dir/fault.out" >/dev/null ||
    fail "no FAILED flash variant in the table: $(head -n 5 "$dir/fault.out")"
[ "$(wc -l <"$dir/fault.err")" -ge 1 ] && grep -q "checks failed" "$dir/fault.err" ||
    fail "no one-line summary on stderr: $(cat "$dir/fault.err")"
"$python" - "$dir/fault.json" <<'PY' || fail "the fault report"
import json, sys
report = json.load(open(sys.argv[1]))
failed = [v for v in report["variants"] if v["result"] == "failed"]
assert failed and all("flash" in v["variant"] for v in failed), failed
assert any("fault injected" in v["detail"] or "build" in v["unit"] for v in failed), failed
PY
"$python" -c "import numpy as np; r = np.random.default_rng(1); [np.save('$dir/' + n + '.npy', r.standard_normal((1, 2, 17, 16)).astype('f4')) for n in 'qkv']" ||
    fail "cannot write the inputs"
"$cli" sdpa --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" --causal --out "$dir/y0.npy" \
    2>"$dir/sdpa0.err" || fail "sdpa exited $? ($(cat "$dir/sdpa0.err"))"
grep -q "failed validation" "$dir/sdpa0.err" && fail "a clean sdpa reported a failed variant"
CLATTN_FAULT_VARIANT=flash "$cli" sdpa --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" \
    --causal --out "$dir/y1.npy" 2>"$dir/sdpa1.err" ||
    fail "sdpa with a planted fault exited $? ($(cat "$dir/sdpa1.err"))"
[ "$(grep -c "failed validation" "$dir/sdpa1.err")" -eq 1 ] &&
    grep -Eq "flash[a-z_]*\.cl:[a-z_]+@[0-9a-f]+" "$dir/sdpa1.err" ||
    fail "sdpa with a planted fault: not one line naming the variant: $(cat "$dir/sdpa1.err")"
"$python" -c "import numpy as np, sys; a, b = np.load('$dir/y0.npy'), np.load('$dir/y1.npy'); sys.exit(0 if np.isfinite(b).all() and np.allclose(a, b, rtol=1e-5, atol=1e-6) else 1)" ||
    fail "sdpa with a planted fault gave other numbers than without"
echo "cli_doctor: passed in $(( $(date +%s) - start )) s"
