#!/bin/sh
# `mpirun -np N clattn sdpa ... --ring` prints the same output as the single-device command
# (small fixtures, printed to 6 decimals; numbers within 2e-6), for N = 2, 3, 4, both layouts,
# and refuses what the
# ring does not take without leaving a rank waiting. Usage: cli_ring_test.sh CLATTN FIXTURES MPIEXEC
set -u
clattn=$1 fixtures=$2 mpiexec=$3
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
# The two printouts match word for word, numbers within 2e-6 (the ring's merge rounds apart;
# TOL=... for 16-bit inputs, whose ring output is rounded to their type once).
same() {
    awk 'NR == FNR { for (i = 1; i <= NF; ++i) a[FNR, i] = $i; n[FNR] = NF; lines = FNR; next }
         { if (n[FNR] != NF) { print "line " FNR ": " NF " words, want " n[FNR]; bad = 1 }
           for (i = 1; i <= NF; ++i) {
               x = a[FNR, i]; y = $i
               if (x == y) continue
               if (x ~ /^-?[0-9.]+$/ && y ~ /^-?[0-9.]+$/ && (x - y <= tol && y - x <= tol))
                   continue
               print "line " FNR " word " i ": " y ", want " x; bad = 1 } }
         END { if (FNR != lines) { print FNR " lines, want " lines; bad = 1 } exit bad }' \
        tol="${TOL:-2e-6}" "$1" "$2"
}
run_case() { # name, then sdpa options
    name=$1
    shift
    # stdout only is compared: stderr may carry the OpenCL compiler's warnings when a kernel
    # variant is not in PoCL's cache yet (with ctest -j, no earlier entry need have built it).
    "$clattn" sdpa "$@" >"$work/one.txt" 2>"$work/one.err" ||
        { echo "FAIL $name: single device"; cat "$work/one.err"; fail=1; return; }
    for n in 2 3 4; do
        for layout in contiguous zigzag; do
            if ! timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np $n "$clattn" sdpa \
                "$@" --ring --ring-layout $layout >"$work/ring.txt" 2>"$work/ring.err"; then
                echo "FAIL $name: -np $n $layout exited non-zero:"
                cat "$work/ring.txt" "$work/ring.err"; fail=1
            elif ! same "$work/one.txt" "$work/ring.txt" >"$work/diff.txt"; then
                echo "FAIL $name: -np $n $layout differs from one device:"
                cat "$work/diff.txt" "$work/ring.err"
                fail=1
            else
                echo "ok   $name: -np $n $layout"
            fi
        done
    done
}
q=$fixtures/self_query.npy   # (2, 5, 8): B=2, L=5, 2 heads of 4
c=$fixtures/causal_query.npy # (1, 6, 8)
run_case self --q "$q" --k "$q" --v "$q" --q-heads 2
run_case causal-window-softcap --q "$c" --k "$c" --v "$c" --q-heads 2 --causal --window 2,-1 \
    --softcap 1.5
run_case gqa-causal --q "$c" --k "$c" --v "$c" --q-heads 2 --kv-heads 2 --causal --scale 0.3
# Issue 28's ring leftovers: key padding from per-batch counts (top-left causal), keys of
# another length (cross-attention; bottom-right causal), and float16 inputs (the blocks travel
# as float16, out rounded to it once: within half an ulp of one device's float32 printout).
kv=$fixtures/ring_kv.npy           # (2, 7, 8): self_query's batch, 7 keys
ckv=$fixtures/ring_causal_kv.npy   # (1, 9, 8): causal_query's batch, 9 keys
counts=$fixtures/ring_counts.npy   # (2,) int64: 3 and 5 keys
run_case nonpad-causal --q "$q" --k "$q" --v "$q" --q-heads 2 --nonpad-kv-seqlen "$counts" \
    --causal --causal-align top-left
run_case cross --q "$q" --k "$kv" --v "$kv" --q-heads 2
run_case cross-nonpad --q "$q" --k "$kv" --v "$kv" --q-heads 2 --nonpad-kv-seqlen "$counts"
run_case sinks-causal --q "$q" --k "$q" --v "$q" --q-heads 2 --causal \
    --sinks "$fixtures/ring_sinks.npy"
run_case cross-bottom-right --q "$c" --k "$ckv" --v "$ckv" --q-heads 2 --causal \
    --causal-align bottom-right --window 3,-1
TOL=1e-3
run_case f16-cross --q "$fixtures/ring_q_f16.npy" --k "$fixtures/ring_kv_f16.npy" \
    --v "$fixtures/ring_kv_f16.npy" --q-heads 2
TOL=2e-6
# Refused on every rank (exit 2), none left waiting.
timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$clattn" sdpa --q "$q" \
    --k "$q" --v "$q" --q-heads 2 --ring --norm relu >"$work/refused.txt" 2>&1
status=$?
if [ $status -eq 124 ] || [ $status -eq 0 ]; then
    echo "FAIL refused: --ring --norm relu gave status $status"; fail=1
else
    echo "ok   refused: --ring --norm relu (status $status)"
fi
timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$clattn" sdpa --q "$q" \
    --k "$q" --v "$q" --q-heads 2 --ring --nonpad-kv-seqlen "$counts" --causal \
    >"$work/refused.txt" 2>&1
status=$?
if [ $status -ne 2 ] || ! grep -q "give --causal-align top-left" "$work/refused.txt"; then
    echo "FAIL refused: --ring --nonpad-kv-seqlen --causal (onnx) gave status $status"; fail=1
else
    echo "ok   refused: --ring --nonpad-kv-seqlen --causal without top-left (status $status)"
fi
exit $fail
