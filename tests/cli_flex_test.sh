#!/bin/sh
# `clattn sdpa --score-mod FILE.cl --aux NAME=FILE`: user score and mask functions from the
# shell. A soft-capping score_mod plus a per-head relative-position bias read from a float32
# aux table, a document mask_mod reading int64 and int32 id arrays and a bool key flag, and its
# score_mod_grad: Y (fused, with --block-mask, unfused) and dQ, dK, dV (--backward, with and
# without --block-mask) against a float64 numpy reference; then the refusals: a non-zero exit
# and one line naming the cause.
# Usage: cli_flex_test.sh CLATTN [PYTHON] (PYTHON: one with numpy, default /usr/bin/python3;
# exit 77, skipped, without it).
set -u
. "$(dirname "$0")/cli_test_setup.sh"
cat >"$work/ref.py" <<'EOF'
import sys

import numpy as np
from cli_reference import compare

B, H, LQ, LK, D, CAP = 2, 3, 17, 33, 16, 4.0
W = LQ + LK - 1  # the bias table's width: q - k + LK - 1 in 0 .. W - 1
SOURCE = f"""/* soft-capping, then a relative-position bias per head; documents */
float score_mod(float score, int b, int h, int q_idx, int kv_idx)
{{
    return {CAP:.1f}f * tanh(score / {CAP:.1f}f) + bias[h * {W} + q_idx - kv_idx + {LK - 1}];
}}

float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx)
{{
    const float t = tanh(score / {CAP:.1f}f);
    return 1.0f - t * t; // d score_mod / d score
}}

int mask_mod(int b, int h, int q_idx, int kv_idx)
{{
    return (qdoc[q_idx] == kdoc[kv_idx] && usable[kv_idx]) || kv_idx == 0;
}}
"""


def gen(d):
    r = np.random.default_rng(41)
    f32 = np.float32
    for n, s in (("q", (B, H, LQ, D)), ("k", (B, H, LK, D)), ("v", (B, H, LK, D)),
                 ("do", (B, H, LQ, D))):
        np.save(f"{d}/{n}.npy", r.standard_normal(s).astype(f32) * (2.0 if n == "q" else 1.0))
    np.save(f"{d}/bias.npy", r.uniform(-1, 1, (H, W)).astype(f32))
    np.save(f"{d}/qdoc.npy", (np.arange(LQ) * 3 // LQ).astype(np.int64))
    np.save(f"{d}/kdoc.npy", (np.arange(LK) * 3 // LK).astype(np.int32))
    np.save(f"{d}/usable.npy", r.uniform(0, 1, LK) < 0.8)  # bool
    with open(f"{d}/score.cl", "w") as f:
        f.write(SOURCE)


def reference(d):
    load = lambda n: np.load(f"{d}/{n}.npy").astype(np.float64)
    q, k, v, do, bias = load("q"), load("k"), load("v"), load("do"), load("bias")
    qdoc, kdoc = np.load(f"{d}/qdoc.npy"), np.load(f"{d}/kdoc.npy")
    usable = np.load(f"{d}/usable.npy")
    scale = 1.0 / np.sqrt(D)
    i, j = np.arange(LQ)[:, None], np.arange(LK)[None, :]
    x = scale * np.einsum("bhid,bhjd->bhij", q, k)
    t = np.tanh(x / CAP)
    s = CAP * t + bias[:, i - j + LK - 1][None]  # (1, H, LQ, LK)
    keep = ((qdoc[:, None] == kdoc[None, :]) & usable[None, :]) | (j == 0)
    s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    P = e / e.sum(-1, keepdims=True)
    O = P @ v
    dP = do @ v.transpose(0, 1, 3, 2)
    dS = P * (dP - (do * O).sum(-1, keepdims=True))
    dx = dS * (1.0 - t * t)
    return {"y": O, "dq": scale * dx @ k, "dk": scale * np.einsum("bhij,bhid->bhjd", dx, q),
            "dv": np.einsum("bhij,bhid->bhjd", P, do)}


def check(d, label, names):
    want = reference(d)
    bad = 0
    for n in names.split(","):
        got = np.load(f"{d}/{label}-{n}.npy").astype(np.float64)
        bad |= not compare(label, n, got, want[n])
    sys.exit(bad)


if sys.argv[1] == "gen":
    gen(sys.argv[2])
else:
    check(sys.argv[2], sys.argv[3], sys.argv[4])
EOF

d=$work/in
mkdir -p "$d"
"$python" "$work/ref.py" gen "$d" || { echo "FAIL: gen"; exit 1; }
inputs="--q $d/q.npy --k $d/k.npy --v $d/v.npy --score-mod $d/score.cl --aux bias=$d/bias.npy \
--aux qdoc=$d/qdoc.npy --aux kdoc=$d/kdoc.npy --aux usable=$d/usable.npy"

run() { # label, the outputs the reference checks, then more sdpa options
    label=$1 names=$2
    shift 2
    # shellcheck disable=SC2086 # inputs: paths without spaces
    if "$clattn" sdpa $inputs "$@" >"$work/out.txt" 2>"$work/err.txt"; then
        "$python" "$work/ref.py" check "$d" "$label" "$names" || fail=1
    else
        echo "FAIL $label: clattn sdpa exited non-zero:"
        cat "$work/out.txt" "$work/err.txt"
        fail=1
    fi
}
run fused y --out "$d/fused-y.npy"
run blocks y --block-mask 8,16 --out "$d/blocks-y.npy"
run unfused y --path unfused --out "$d/unfused-y.npy"
grads() { # label: --backward's outputs into label-*.npy
    echo --backward --grad-out "$d/do.npy" --out "$d/$1-y.npy" --grad-q-out "$d/$1-dq.npy" \
        --grad-k-out "$d/$1-dk.npy" --grad-v-out "$d/$1-dv.npy"
}
# shellcheck disable=SC2046 # grads: paths without spaces
run backward y,dq,dk,dv $(grads backward)
# shellcheck disable=SC2046
run backward-blocks y,dq,dk,dv --block-mask 16,8 $(grads backward-blocks)

# Refusals: a non-zero exit (2: the input) and one line of clattn's naming the cause (a build
# error may add the OpenCL compiler's own lines, as pocl's "1 error generated."); no output.
refuse() { # name, a word the line must hold, then sdpa options
    name=$1 word=$2
    shift 2
    rm -f "$work/y.npy"
    "$clattn" sdpa --q "$d/q.npy" --k "$d/k.npy" --v "$d/v.npy" --out "$work/y.npy" "$@" \
        >"$work/out.txt" 2>"$work/err.txt"
    status=$?
    lines=$(grep -c '^clattn ' "$work/err.txt")
    if [ "$status" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$word" "$work/err.txt" ||
        [ -e "$work/y.npy" ]; then
        echo "FAIL refuse $name: status $status (want 2), $lines clattn lines (want 1, holding" \
            "'$word'):"
        cat "$work/out.txt" "$work/err.txt"
        fail=1
    else
        echo "ok   refuse $name: $(grep '^clattn ' "$work/err.txt")"
    fi
}
printf 'float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n{\n    return score + undefined_name;\n}\n' >"$work/broken.cl"
printf 'float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n{\n    return 2.0f * score;\n}\n' >"$work/nograd.cl"
printf '/* score_mod( in a comment */\nfloat helper(float x) { return x; }\n' >"$work/none.cl"
"$python" -c "import numpy as np; np.save('$work/half.npy', np.ones(3, np.float16)); \
np.save('$work/huge.npy', np.array([0, 1 << 30], np.int64))"
refuse missing-source "cannot read" --score-mod "$work/missing.cl"
refuse missing-aux "missing.npy" --score-mod "$d/score.cl" --aux bias="$work/missing.npy"
refuse bad-name "not a C identifier" --score-mod "$d/score.cl" --aux 2bias="$d/bias.npy"
refuse no-name "NAME=FILE" --score-mod "$d/score.cl" --aux "$d/bias.npy"
refuse five-aux "at most 4" --score-mod "$d/score.cl" --aux a="$d/bias.npy" \
    --aux b="$d/bias.npy" --aux c="$d/bias.npy" --aux e="$d/bias.npy" --aux f="$d/bias.npy"
refuse repeated-name "given twice" --score-mod "$d/score.cl" --aux a="$d/bias.npy" \
    --aux a="$d/qdoc.npy"
refuse build-error "score_mod:3" --score-mod "$work/broken.cl"
refuse undeclared-aux "score_mod:" --score-mod "$d/score.cl" --aux bias="$d/bias.npy"
refuse float16-aux "float16" --score-mod "$d/score.cl" --aux bias="$work/half.npy"
refuse int64-range "2^24" --score-mod "$d/score.cl" --aux bias="$work/huge.npy"
refuse defines-none "defines none" --score-mod "$work/none.cl"
refuse backward-no-grad "score_mod_grad" --score-mod "$work/nograd.cl" --backward \
    --grad-out "$d/do.npy" --grad-q-out "$work/y.npy"
refuse aux-alone "needs --score-mod" --aux bias="$d/bias.npy"
refuse block-mask-alone "needs --score-mod" --block-mask 8,8
refuse block-mask-no-mask-mod "mask_mod" --score-mod "$work/nograd.cl" --block-mask 8,8
refuse block-mask-unfused "fused path" --score-mod "$d/score.cl" --block-mask 8,8 \
    --path unfused
refuse block-mask-one-size "BQ,BK" --score-mod "$d/score.cl" --block-mask 8
refuse tree-without-aux "tree_meta" --score-mod @tree

# --score-mod @tree: speculative decoding's tree mask (clattn_flex_tree_mask), two sequences'
# draft trees (5 and 2 drafts) after their prefixes, against float64 attention with the mask.
t=$work/tree
mkdir -p "$t"
cat >"$t/tree.py" <<'EOF'
import sys

import numpy as np
from cli_reference import compare

B, H, LQ, LK, D = 2, 2, 5, 21, 8
PARENTS = ([-1, 0, 0, 1, 3], [-1, -1])
d = sys.argv[2]
keep = np.zeros((B, LQ, LK), bool)
bits, meta = [], []
for b, parents in enumerate(PARENTS):
    n, start = len(parents), LK - len(parents)
    m = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j], j = True, parents[j]
    keep[b, :, :start] = True
    keep[b, :n, start:] = m
    meta.append((start, n, sum(x.size for x in bits)))
    bits.append(np.packbits(m.reshape(-1), bitorder="little"))
if sys.argv[1] == "gen":
    r = np.random.default_rng(8)
    for n, s in (("q", (B, H, LQ, D)), ("k", (B, H, LK, D)), ("v", (B, H, LK, D))):
        np.save(f"{d}/{n}.npy", r.standard_normal(s).astype(np.float32))
    np.save(f"{d}/bits.npy", np.concatenate(bits))
    np.save(f"{d}/meta.npy", np.array(meta, np.int32))
else:
    q, k, v = (np.load(f"{d}/{n}.npy").astype(np.float64) for n in "qkv")
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(D)
    s = np.where(keep[:, None], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    sys.exit(0 if compare("tree", "y", np.load(f"{d}/y.npy").astype(np.float64), want) else 1)
EOF
if "$python" "$t/tree.py" gen "$t" &&
    "$clattn" sdpa --q "$t/q.npy" --k "$t/k.npy" --v "$t/v.npy" --score-mod @tree \
        --aux tree_bits="$t/bits.npy" --aux tree_meta="$t/meta.npy" --out "$t/y.npy" \
        >"$work/out.txt" 2>"$work/err.txt"; then
    "$python" "$t/tree.py" check "$t" || fail=1
else
    echo "FAIL tree: clattn sdpa --score-mod @tree exited non-zero:"
    cat "$work/out.txt" "$work/err.txt"
    fail=1
fi
exit $fail
