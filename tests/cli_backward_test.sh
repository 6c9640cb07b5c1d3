#!/bin/sh
# `clattn sdpa --backward`: dQ, dK, dV (and a float mask's and the sinks' gradients, and Y)
# written by the command against a float64 numpy reference of the attention backward
# (P = softmax(cap(scale Q Kᵀ) + mask), dV = Pᵀ dO, dP = dO Vᵀ, dS = P (dP - rowsum(dO O)),
# dQ = dS' K scale, dK = dS'ᵀ Q scale, dS' = dS times cap's derivative) at awkward sizes; and
# what the backward refuses: a non-zero exit with one line on stderr.
# Usage: cli_backward_test.sh CLATTN [PYTHON] (PYTHON: one with numpy, default /usr/bin/python3;
# exit 77, skipped, without it).
set -u
. "$(dirname "$0")/cli_test_setup.sh"
cat >"$work/ref.py" <<'EOF'
import sys

import numpy as np
from cli_reference import attention, compare, from_file, load_inputs, save_inputs

# name: B, Hq, Hkv, Lq, Lk, dk, dv, rank 3 files?, options; and what the reference applies
CASES = {
    # top-left causal (ONNX's default alignment with no past), Lq < Lk
    "causal": dict(B=2, Hq=3, Hkv=3, Lq=17, Lk=33, dk=16, dv=16, rank3=False,
                   causal=0, args=["--causal"]),
    # grouped heads (2 query heads per K/V head), rank-3 files, dk != dv, a float (Lq, 30)
    # mask padded to Lk as masked, sinks, softcap, an explicit scale
    "gqa-mask-sinks-softcap": dict(B=2, Hq=4, Hkv=2, Lq=17, Lk=33, dk=16, dv=8, rank3=True,
                                   mask_width=30, sinks=True, softcap=2.0, scale=0.3,
                                   args=["--q-heads", "4", "--kv-heads", "2", "--softcap", "2",
                                         "--scale", "0.3"]),
    # a bottom-right window (keys p - 6 .. p + 2, p = i + Lk - Lq) with ALiBi
    "window-alibi": dict(B=1, Hq=2, Hkv=2, Lq=17, Lk=33, dk=16, dv=16, rank3=False,
                         window=(6, 2), offset=16, alibi=True,
                         args=["--window", "6,2", "--causal-align", "bottom-right", "--alibi"]),
    # both passes unfused (no lse: the backward's reference path), causal, grouped heads
    "unfused-gqa": dict(B=2, Hq=4, Hkv=2, Lq=19, Lk=19, dk=16, dv=24, rank3=False, causal=0,
                        args=["--path", "unfused", "--causal", "--q-heads", "4", "--kv-heads",
                              "2"]),
}


def gen(name, d):
    c = CASES[name]
    r = save_inputs(c, name, d)
    f32 = np.float32
    args = list(c["args"])
    if "mask_width" in c:
        np.save(f"{d}/mask.npy", r.uniform(-1, 1, (c["Lq"], c["mask_width"])).astype(f32))
        args += ["--attn-mask", f"{d}/mask.npy", "--grad-mask-out", f"{d}/dmask.npy"]
    if c.get("sinks"):
        np.save(f"{d}/sinks.npy", r.uniform(-1, 1, c["Hq"]).astype(f32))
        args += ["--sinks", f"{d}/sinks.npy", "--grad-sinks-out", f"{d}/dsinks.npy"]
    print(" ".join(args))


def check(name, d):
    c = CASES[name]
    load = lambda n: np.load(f"{d}/{n}.npy").astype(np.float64)
    q, k, v, do = load_inputs(c, d)
    mask = load("mask") if "mask_width" in c else None
    sinks = load("sinks") if c.get("sinks") else None
    want = attention(c, q, k, v, do, mask, sinks)
    del want["w"]
    heads = {"y": c["Hq"], "dq": c["Hq"], "dk": c["Hkv"], "dv": c["Hkv"]}
    bad = 0
    for n, ref in want.items():
        got = np.load(f"{d}/{n}.npy").astype(np.float64)
        if n in heads:
            got = from_file(got, heads[n], c["rank3"])
        bad |= not compare(name, n, got, ref)
    sys.exit(bad)


(gen if sys.argv[1] == "gen" else check)(sys.argv[2], sys.argv[3])
EOF

for name in causal gqa-mask-sinks-softcap window-alibi unfused-gqa; do
    dir=$work/$name
    mkdir -p "$dir"
    extra=$("$python" "$work/ref.py" gen "$name" "$dir") || { echo "FAIL $name: gen"; exit 1; }
    # shellcheck disable=SC2086 # extra: the case's options, paths without spaces
    if ! "$clattn" sdpa --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" $extra \
        --backward --grad-out "$dir/do.npy" --out "$dir/y.npy" --grad-q-out "$dir/dq.npy" \
        --grad-k-out "$dir/dk.npy" --grad-v-out "$dir/dv.npy" >"$work/out.txt" 2>"$work/err.txt"
    then
        echo "FAIL $name: clattn sdpa --backward exited non-zero:"
        cat "$work/out.txt" "$work/err.txt"
        fail=1
        continue
    fi
    "$python" "$work/ref.py" check "$name" "$dir" || fail=1
done

# Packed sequences (--cu-seqlens-q/-k): Q (total_q, Hq, d), K and V (total_k, Hkv, d), dO
# packed as Y; lengths with an empty one, Lq != Lk per sequence, grouped heads, bottom-right
# causal (each sequence's own diagonal); the reference per sequence.
dir=$work/varlen
mkdir -p "$dir"
cat >"$work/varlen.py" <<'EOF'
import sys

import numpy as np
from cli_reference import attention, compare

LQ, LK, HQ, HKV, D = [5, 0, 9, 1], [7, 3, 12, 4], 4, 2, 16
cq, ck = np.concatenate([[0], np.cumsum(LQ)]), np.concatenate([[0], np.cumsum(LK)])
d = sys.argv[2]
if sys.argv[1] == "gen":
    r = np.random.default_rng(29)
    f32 = np.float32
    np.save(f"{d}/q.npy", r.standard_normal((cq[-1], HQ, D)).astype(f32))
    np.save(f"{d}/k.npy", r.standard_normal((ck[-1], HKV, D)).astype(f32))
    np.save(f"{d}/v.npy", r.standard_normal((ck[-1], HKV, D)).astype(f32))
    np.save(f"{d}/do.npy", r.standard_normal((cq[-1], HQ, D)).astype(f32))
    np.save(f"{d}/cq.npy", cq.astype(np.int32))
    np.save(f"{d}/ck.npy", ck.astype(np.int32))
    sys.exit(0)
load = lambda n: np.load(f"{d}/{n}.npy").astype(np.float64)
q, k, v, do = load("q"), load("k"), load("v"), load("do")
want = {n: np.zeros_like(a) for n, a in (("y", do), ("dq", q), ("dk", k), ("dv", v))}
for b in range(len(LQ)):
    rq, rk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
    if LQ[b] == 0:
        continue
    seq = lambda a, rows: a[rows].transpose(1, 0, 2)[None]  # (1, H, L, d)
    c = dict(causal=LK[b] - LQ[b])  # bottom-right: key j <= i + Lk - Lq
    got = attention(c, seq(q, rq), seq(k, rk), seq(v, rk), seq(do, rq))
    for n, rows in (("y", rq), ("dq", rq), ("dk", rk), ("dv", rk)):
        want[n][rows] = got[n][0].transpose(1, 0, 2)
bad = 0
for n, ref in want.items():
    bad |= not compare("varlen", n, load(n), ref)
sys.exit(bad)
EOF
if "$python" "$work/varlen.py" gen "$dir" &&
    "$clattn" sdpa --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" \
        --cu-seqlens-q "$dir/cq.npy" --cu-seqlens-k "$dir/ck.npy" --causal \
        --causal-align bottom-right --backward --grad-out "$dir/do.npy" --out "$dir/y.npy" \
        --grad-q-out "$dir/dq.npy" --grad-k-out "$dir/dk.npy" --grad-v-out "$dir/dv.npy" \
        >"$work/out.txt" 2>"$work/err.txt"; then
    "$python" "$work/varlen.py" check "$dir" || fail=1
else
    echo "FAIL varlen: clattn sdpa --cu-seqlens-q --backward exited non-zero:"
    cat "$work/out.txt" "$work/err.txt"
    fail=1
fi

# Refusals: a non-zero exit and one line naming the cause (the library's, for the backward's).
refuse() { # name, expected status, a word the line must hold, then sdpa options
    name=$1 want=$2 word=$3
    shift 3
    cli_refuse "$name" "$want" "$word" "$work/dq.npy" sdpa "$@"
}
d=$work/causal
refuse rope 2 rope --q "$d/q.npy" --k "$d/k.npy" --v "$d/v.npy" --rope --backward \
    --grad-out "$d/do.npy" --grad-q-out "$work/dq.npy"
refuse no-grad-out 2 grad-out --q "$d/q.npy" --k "$d/k.npy" --v "$d/v.npy" --backward \
    --grad-q-out "$work/dq.npy"
refuse grad-without-backward 2 backward --q "$d/q.npy" --k "$d/k.npy" --v "$d/v.npy" \
    --grad-q-out "$work/dq.npy"
refuse grad-out-shape 2 "dO has shape" --q "$d/q.npy" --k "$d/k.npy" --v "$d/v.npy" --backward \
    --grad-out "$d/k.npy" --grad-q-out "$work/dq.npy"
exit $fail
