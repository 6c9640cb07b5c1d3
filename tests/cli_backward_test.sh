#!/bin/sh
# `clattn sdpa --backward`: dQ, dK, dV (and a float mask's and the sinks' gradients, and Y)
# written by the command against a float64 numpy reference of the attention backward
# (P = softmax(cap(scale Q Kᵀ) + mask), dV = Pᵀ dO, dP = dO Vᵀ, dS = P (dP - rowsum(dO O)),
# dQ = dS' K scale, dK = dS'ᵀ Q scale, dS' = dS times cap's derivative) at awkward sizes; and
# what the backward refuses: a non-zero exit with one line on stderr.
# Usage: cli_backward_test.sh CLATTN [PYTHON] (PYTHON: one with numpy, default /usr/bin/python3;
# exit 77, skipped, without it).
set -u
clattn=$1 python=${2:-/usr/bin/python3}
"$python" -c 'import numpy' 2>/dev/null || { echo "SKIP: no numpy for $python"; exit 77; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
cat >"$work/ref.py" <<'EOF'
import sys
import numpy as np

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
}


def to_file(x, rank3):  # (B, H, L, d) -> the file's (B, L, H * d) when rank 3
    if not rank3:
        return x
    b, h, l, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, l, h * d)


def from_file(x, heads, rank3):
    if not rank3:
        return x
    b, l, hd = x.shape
    return x.reshape(b, l, heads, hd // heads).transpose(0, 2, 1, 3)


def gen(name, d):
    c = CASES[name]
    r = np.random.default_rng(sum(map(ord, name)))
    f32 = np.float32
    shapes = {"q": (c["B"], c["Hq"], c["Lq"], c["dk"]), "k": (c["B"], c["Hkv"], c["Lk"], c["dk"]),
              "v": (c["B"], c["Hkv"], c["Lk"], c["dv"]), "do": (c["B"], c["Hq"], c["Lq"], c["dv"])}
    for n, s in shapes.items():
        np.save(f"{d}/{n}.npy", to_file(r.standard_normal(s).astype(f32), c["rank3"]))
    args = list(c["args"])
    if "mask_width" in c:
        np.save(f"{d}/mask.npy", r.uniform(-1, 1, (c["Lq"], c["mask_width"])).astype(f32))
        args += ["--attn-mask", f"{d}/mask.npy", "--grad-mask-out", f"{d}/dmask.npy"]
    if c.get("sinks"):
        np.save(f"{d}/sinks.npy", r.uniform(-1, 1, c["Hq"]).astype(f32))
        args += ["--sinks", f"{d}/sinks.npy", "--grad-sinks-out", f"{d}/dsinks.npy"]
    print(" ".join(args))


def reference(c, q, k, v, do, mask, sinks):
    B, Hq, Lq, dk = q.shape
    Lk, g = k.shape[2], Hq // k.shape[1]
    scale = c.get("scale", 1.0 / np.sqrt(dk))
    K, V = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    x = scale * np.einsum("bhid,bhjd->bhij", q, K)
    cap = c.get("softcap", 0.0)
    t = np.tanh(x / cap) if cap else None
    s = cap * t if cap else x
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    keep = np.ones((Lq, Lk), bool)
    if "causal" in c:
        keep &= j <= i + c["causal"]
    if "window" in c:
        p, (left, right) = i + c["offset"], c["window"]
        keep &= (j >= p - left) & (j <= p + right)
    if mask is not None:
        padded = np.full((Lq, Lk), -np.inf)
        padded[:, :mask.shape[1]] = mask
        s = s + padded
    if c.get("alibi"):  # the paper's slopes, Hq a power of two
        slopes = 2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)
        s = s - slopes[None, :, None, None] * np.abs(i + Lk - Lq - j)
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks[None, :, None, None])
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    if sinks is not None:
        z = z + np.exp(sinks[None, :, None, None] - m)
    P = e / z
    O = P @ V
    dV = np.einsum("bhij,bhid->bhjd", P, do)
    dP = do @ V.transpose(0, 1, 3, 2)
    delta = (do * O).sum(-1, keepdims=True)
    dS = P * (dP - delta)
    dx = dS * (1.0 - t * t) if cap else dS
    dQ = scale * dx @ K
    dK = scale * np.einsum("bhij,bhid->bhjd", dx, q)
    grads = {"y": O, "dq": dQ, "dk": dK.reshape(B, -1, g, Lk, dk).sum(2),
             "dv": dV.reshape(B, -1, g, Lk, V.shape[-1]).sum(2)}
    if mask is not None:
        grads["dmask"] = dS.sum((0, 1))[:, :mask.shape[1]]
    if sinks is not None:
        grads["dsinks"] = -(np.exp(sinks[None, :, None, None] - m) / z * delta).sum((0, 2, 3))
    return grads


def check(name, d):
    c = CASES[name]
    load = lambda n: np.load(f"{d}/{n}.npy").astype(np.float64)
    rank3 = c["rank3"]
    q, k = from_file(load("q"), c["Hq"], rank3), from_file(load("k"), c["Hkv"], rank3)
    v, do = from_file(load("v"), c["Hkv"], rank3), from_file(load("do"), c["Hq"], rank3)
    mask = load("mask") if "mask_width" in c else None
    sinks = load("sinks") if c.get("sinks") else None
    want = reference(c, q, k, v, do, mask, sinks)
    heads = {"y": c["Hq"], "dq": c["Hq"], "dk": c["Hkv"], "dv": c["Hkv"]}
    bad = 0
    for n, ref in want.items():
        got = np.load(f"{d}/{n}.npy")
        if n in heads:
            got = from_file(got.astype(np.float64), heads[n], rank3)
        if got.shape != ref.shape:
            print(f"FAIL {name}: {n} has shape {got.shape}, want {ref.shape}")
            bad = 1
            continue
        err = float(np.max(np.abs(got - ref)))
        bound = 1e-4 * float(np.max(np.abs(ref))) + 1e-6
        ok = err <= bound and np.all(np.isfinite(got))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {n} {got.shape} max err {err:.3g} "
              f"(bound {bound:.3g})")
        bad |= not ok
    sys.exit(bad)


(gen if sys.argv[1] == "gen" else check)(sys.argv[2], sys.argv[3])
EOF

for name in causal gqa-mask-sinks-softcap window-alibi; do
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

# Refusals: a non-zero exit and one line naming the cause (the library's, for the backward's).
refuse() { # name, expected status, a word the line must hold, then sdpa options
    name=$1 want=$2 word=$3
    shift 3
    "$clattn" sdpa "$@" >"$work/out.txt" 2>"$work/err.txt"
    status=$?
    lines=$(grep -c . "$work/err.txt")
    if [ "$status" -ne "$want" ] || [ "$lines" -ne 1 ] || ! grep -q -- "$word" "$work/err.txt" ||
        [ -e "$work/dq.npy" ]; then
        echo "FAIL refuse $name: status $status (want $want), $lines stderr lines:"
        cat "$work/out.txt" "$work/err.txt"
        fail=1
    else
        echo "ok   refuse $name: $(cat "$work/err.txt")"
    fi
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
