#!/bin/sh
# `clattn merge`: two partial attention states merged by their log-sum-exp (clattn_merge_states)
# from the shell. Seeded random O_a, O_b (rank 2, 3 and 4, awkward sizes: one row of one column,
# 17 x 3 rows of 63, 2 x 3 x 5 rows of 65) with log-sum-exps far apart, rows where one side
# or both are empty (lse -inf), against a float64 numpy merge; a side empty in every row is a
# no-op (the other side's O and LSE bit for bit); then the refusals: exit 2 and one line naming
# the file, no output written.
# Usage: cli_merge_test.sh CLATTN [PYTHON] (PYTHON: one with numpy, default /usr/bin/python3;
# exit 77, skipped, without it).
set -u
. "$(dirname "$0")/cli_test_setup.sh"
cat >"$work/ref.py" <<'EOF'
import sys

import numpy as np

CASES = {"r2": (1, 1), "r3": (17, 3, 63), "r4": (2, 3, 5, 65)}


def gen(d, name, shape):
    r = np.random.default_rng(sum(map(ord, name)) + 50)
    rows = shape[:-1]
    for side in "ab":
        np.save(f"{d}/{name}-o{side}.npy", r.standard_normal(shape).astype(np.float32))
    la = r.uniform(-30, 30, rows)
    lb = la + r.choice([-60.0, -3.0, 0.0, 0.5, 3.0, 60.0], rows)  # near and far apart
    if la.size > 2:  # some rows with one side empty, one with both
        flat_a, flat_b = la.reshape(-1), lb.reshape(-1)
        flat_a[1::7] = -np.inf
        flat_b[2::5] = -np.inf
        flat_a[-1] = flat_b[-1] = -np.inf
    np.save(f"{d}/{name}-la.npy", la.astype(np.float32))
    np.save(f"{d}/{name}-lb.npy", lb.astype(np.float32))
    # a side empty in every row: the merge is the other side as it is
    np.save(f"{d}/{name}-empty.npy", np.full(rows, -np.inf, np.float32))


def reference(d, name):
    """The float64 merge: m = max(lse_a, lse_b), w = exp(lse - m), o = (w_a o_a + w_b o_b) /
    (w_a + w_b), lse = m + log(w_a + w_b); no key on either side: zeros and -inf."""
    load = lambda n: np.load(f"{d}/{name}-{n}.npy").astype(np.float64)
    oa, ob, la, lb = load("oa"), load("ob"), load("la"), load("lb")
    m = np.maximum(la, lb)
    none = m == -np.inf
    m = np.where(none, 0.0, m)
    wa, wb = np.exp(la - m), np.exp(lb - m)
    s = wa + wb
    safe = np.where(none, 1.0, s)
    o = (wa[..., None] * oa + wb[..., None] * ob) / safe[..., None]
    o[none] = 0.0
    lse = np.where(none, -np.inf, m + np.log(safe))
    return o, lse


def check(d, name):
    o, lse = reference(d, name)
    got_o = np.load(f"{d}/{name}-o.npy").astype(np.float64)
    got_l = np.load(f"{d}/{name}-l.npy").astype(np.float64)
    ok = got_o.shape == o.shape and got_l.shape == lse.shape
    if ok:
        o_err = float(np.max(np.abs(got_o - o)))
        o_bound = 2e-6 * float(np.max(np.abs(o))) + 1e-7  # float32 rounding: ~2e-7 here
        fin = np.isfinite(lse)
        l_err = float(np.max(np.abs(got_l[fin] - lse[fin]), initial=0.0))
        l_bound = 1e-6 * float(np.max(np.abs(lse[fin]), initial=0.0)) + 1e-6
        ok = (o_err <= o_bound and bool(np.all(np.isfinite(got_o))) and l_err <= l_bound
              and bool(np.all(got_l[~fin] == -np.inf)) and bool(np.all(np.isfinite(got_l[fin]))))
        print(f"{'ok  ' if ok else 'FAIL'} merge {name}: o {got_o.shape} max err {o_err:.3g} "
              f"(bound {o_bound:.3g}), lse max err {l_err:.3g} (bound {l_bound:.3g}), "
              f"{int((~fin).sum())} rows with no key")
    else:
        print(f"FAIL merge {name}: shapes {got_o.shape}, {got_l.shape}; want {o.shape}, "
              f"{lse.shape}")
    return ok


def same(d, name, side):
    """The merge with an empty side is the other side bit for bit (zeros and -inf in its own
    rows with no key)."""
    got_o, got_l = np.load(f"{d}/{name}-o.npy"), np.load(f"{d}/{name}-l.npy")
    want_o, want_l = np.load(f"{d}/{name}-o{side}.npy"), np.load(f"{d}/{name}-l{side}.npy")
    want_o = np.where((want_l == -np.inf)[..., None], np.float32(0), want_o)
    ok = (got_o.tobytes() == want_o.tobytes() and got_l.tobytes() == want_l.tobytes()
          and got_o.shape == want_o.shape and got_l.shape == want_l.shape)
    print(f"{'ok  ' if ok else 'FAIL'} merge {name}: the empty side a no-op (side {side} as it "
          f"is, bit for bit)")
    return ok


if sys.argv[1] == "gen":
    for name, shape in CASES.items():
        gen(sys.argv[2], name, shape)
elif sys.argv[1] == "check":
    sys.exit(0 if check(sys.argv[2], sys.argv[3]) else 1)
else:
    sys.exit(0 if same(sys.argv[3], sys.argv[4], sys.argv[2]) else 1)  # same SIDE DIR NAME
EOF

d=$work/in
mkdir -p "$d"
"$python" "$work/ref.py" gen "$d" || { echo "FAIL: gen"; exit 1; }

merge() { # label, what to check (check | same SIDE), then the merge's four inputs
    label=$1
    shift
    how=$1
    [ "$how" = same ] && { how="same $2"; shift; }
    shift
    # the outputs poisoned first: a merge that writes nothing fails
    "$python" -c "import numpy as np; np.save('$d/$label-o.npy', np.full(3, np.nan, np.float32))"
    cp "$d/$label-o.npy" "$d/$label-l.npy"
    if "$clattn" merge --o-a "$1" --lse-a "$2" --o-b "$3" --lse-b "$4" --out "$d/$label-o.npy" \
        --lse-out "$d/$label-l.npy" >"$work/out.txt" 2>"$work/err.txt"; then
        # shellcheck disable=SC2086 # how: one or two words
        "$python" "$work/ref.py" $how "$d" "$label" || fail=1
    else
        echo "FAIL merge $label: clattn merge exited non-zero:"
        cat "$work/out.txt" "$work/err.txt"
        fail=1
    fi
}
for c in r2 r3 r4; do
    merge "$c" check "$d/$c-oa.npy" "$d/$c-la.npy" "$d/$c-ob.npy" "$d/$c-lb.npy"
done
# an empty side (every row's lse -inf), either side: the other side as it is
for n in r3 r4; do
    cp "$d/$n-oa.npy" "$d/$n-ea-oa.npy"
    cp "$d/$n-la.npy" "$d/$n-ea-la.npy"
    merge "$n-ea" same a "$d/$n-oa.npy" "$d/$n-la.npy" "$d/$n-ob.npy" "$d/$n-empty.npy"
done
cp "$d/r4-ob.npy" "$d/r4-eb-ob.npy"
cp "$d/r4-lb.npy" "$d/r4-eb-lb.npy"
merge r4-eb same b "$d/r4-oa.npy" "$d/r4-empty.npy" "$d/r4-ob.npy" "$d/r4-lb.npy"

# Refusals: exit 2 and one line naming the file at fault; no output written.
"$python" -c "import numpy as np; np.save('$work/rank1.npy', np.zeros(4, np.float32)); \
np.save('$work/rank5.npy', np.zeros((1, 1, 1, 1, 2), np.float32))"
refuse() { # name, the word the line must hold, then merge's inputs
    name=$1 word=$2
    shift 2
    rm -f "$work/o.npy"
    cli_refuse "$name" 2 "$word" "$work/o.npy" merge "$@" --out "$work/o.npy"
}
r3=$d/r3 r4=$d/r4
refuse o-b-head-dim "$r4-ob.npy" --o-a "$r3-oa.npy" --lse-a "$r3-la.npy" --o-b "$r4-ob.npy" \
    --lse-b "$r3-lb.npy"
refuse lse-a-dims "$r4-la.npy" --o-a "$r3-oa.npy" --lse-a "$r4-la.npy" --o-b "$r3-ob.npy" \
    --lse-b "$r3-lb.npy"
refuse lse-b-with-d "$r3-oa.npy" --o-a "$r3-oa.npy" --lse-a "$r3-la.npy" --o-b "$r3-ob.npy" \
    --lse-b "$r3-oa.npy"
refuse rank-1 "rank 1" --o-a "$work/rank1.npy" --lse-a "$r3-la.npy" --o-b "$work/rank1.npy" \
    --lse-b "$r3-lb.npy"
refuse rank-5 "rank 5" --o-a "$work/rank5.npy" --lse-a "$r3-la.npy" --o-b "$work/rank5.npy" \
    --lse-b "$r3-lb.npy"
refuse missing-file "missing.npy" --o-a "$work/missing.npy" --lse-a "$r3-la.npy" \
    --o-b "$r3-ob.npy" --lse-b "$r3-lb.npy"
refuse no-lse-b "--lse-b" --o-a "$r3-oa.npy" --lse-a "$r3-la.npy" --o-b "$r3-ob.npy"
exit "$fail"
