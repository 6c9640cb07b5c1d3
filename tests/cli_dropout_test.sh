#!/bin/sh
# `clattn sdpa --dropout P --seed S --dropout-offset N`, forward and --backward: Y and dQ, dK,
# dV (and the sinks' gradient) against a float64 numpy reference (tests/cli_reference.py,
# shared with cli_backward_test.sh) whose dropout mask is built by a vectorised numpy Philox
# 4x32-10 (checked against Random123's known-answer vectors first), following clattn.h's
# rule: key (S low word, S high word), counter (j / 4, i, low and high word of
# N + b * Hq + h), word j % 4 as u; the weight is kept (and scaled by 1 / (1 - P)) when
# u >= floor(P * 2^32), else zeroed; the normaliser is the undropped row's.
# The unfused path's weights output (--qk-output-mode 3) holds the dropped, scaled weights.
# Then: the same seed twice gives identical files, another seed (the default, 0) another Y,
# --seed without --dropout (or with P = 0) changes nothing, P = 1 gives Y = 0; bench takes
# --dropout; and the refusals: a non-zero exit with one line on stderr.
# Usage: cli_dropout_test.sh CLATTN [PYTHON] (PYTHON: one with numpy, default /usr/bin/python3;
# exit 77, skipped, without it).
set -u
. "$(dirname "$0")/cli_test_setup.sh"
cat >"$work/ref.py" <<'EOF'
import sys

import numpy as np
from cli_reference import (attention, compare, dropout_factor, from_file,
                           load_inputs, philox_self_test, save_inputs)

# name: B, Hq, Hkv, Lq, Lk, dk, dv, rank 3 files?, options; and what the reference applies
CASES = {
    # grouped heads (2 query heads per K/V head), dk != dv, top-left causal, Lq < Lk
    "gqa-causal": dict(B=2, Hq=4, Hkv=2, Lq=17, Lk=33, dk=16, dv=8, rank3=False, causal=0,
                       args=["--causal"]),
    # multi-query rank-3 files, a bottom-right window (keys p - 5 .. p + 3, p = i + Lk - Lq),
    # softcap and sinks (their gradient too)
    "mqa-window-softcap-sinks": dict(B=2, Hq=3, Hkv=1, Lq=13, Lk=29, dk=8, dv=16, rank3=True,
                                     window=(5, 3), offset=16, softcap=2.0, sinks=True,
                                     args=["--q-heads", "3", "--kv-heads", "1", "--window", "5,3",
                                           "--causal-align", "bottom-right", "--softcap", "2"]),
}


def gen(name, d):
    c = CASES[name]
    r = save_inputs(c, name, d)
    f32 = np.float32
    args = list(c["args"])
    if c.get("sinks"):
        np.save(f"{d}/sinks.npy", r.uniform(-1, 1, c["Hq"]).astype(f32))
        args += ["--sinks", f"{d}/sinks.npy"]
    print(" ".join(args))


def check(name, d, tag, p, seed, offset, what):
    c = CASES[name]
    q, k, v, do = load_inputs(c, d)
    sinks = np.load(f"{d}/sinks.npy").astype(np.float64) if c.get("sinks") else None
    B, Hq, Lq, Lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    factor = dropout_factor(float(p), int(seed), int(offset), B, Hq, Lq, Lk)
    want = attention(c, q, k, v, do, sinks=sinks, factor=factor)
    heads = {"y": c["Hq"], "dq": c["Hq"], "dk": c["Hkv"], "dv": c["Hkv"]}
    bad = 0
    for n, ref in want.items():
        if (what == "all" and n == "w") or (what == "y" and n != "y") or \
                (what == "yw" and n not in ("y", "w")):
            continue
        got = np.load(f"{d}/{tag}-{n}.npy").astype(np.float64)
        if n in heads:
            got = from_file(got, heads[n], c["rank3"])
        bad |= not compare(f"{name} {tag}", n, got, ref)
    sys.exit(bad)


def differ(a, b):  # two outputs that must differ (another seed): by more than rounding
    x, y = np.load(a).astype(np.float64), np.load(b).astype(np.float64)
    gap, size = float(np.max(np.abs(x - y))), float(np.max(np.abs(x)))
    ok = gap > 1e-2 * size
    print(f"{'ok  ' if ok else 'FAIL'} another seed: Y differs by {gap:.3g} (|Y| max {size:.3g})")
    sys.exit(0 if ok else 1)


cmd = sys.argv[1]
if cmd == "selftest":
    philox_self_test()
elif cmd == "gen":
    gen(sys.argv[2], sys.argv[3])
elif cmd == "check":
    check(*sys.argv[2:9])
else:
    differ(sys.argv[2], sys.argv[3])
EOF

"$python" "$work/ref.py" selftest || exit 1

# sdpa NAME TAG OPTIONS...: runs clattn sdpa on the case's files; false (a FAIL printed) when
# it exits non-zero.
sdpa() {
    name=$1 tag=$2
    shift 2
    dir=$work/$name
    if ! "$clattn" sdpa --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" "$@" \
        >"$work/out.txt" 2>"$work/err.txt"; then
        echo "FAIL $name $tag: clattn sdpa $* exited non-zero:"
        cat "$work/out.txt" "$work/err.txt"
        fail=1
        return 1
    fi
}
# backward NAME TAG OPTIONS...: the forward and the backward, writing TAG-y, -dq, -dk, -dv
# (and -dsinks with sinks).
backward() {
    name=$1 tag=$2
    shift 2
    dir=$work/$name
    sinks_out=
    [ -e "$dir/sinks.npy" ] && sinks_out="--grad-sinks-out $dir/$tag-dsinks.npy"
    # shellcheck disable=SC2086 # sinks_out: an option and a path without spaces
    sdpa "$name" "$tag" "$@" --backward --grad-out "$dir/do.npy" --out "$dir/$tag-y.npy" \
        --grad-q-out "$dir/$tag-dq.npy" --grad-k-out "$dir/$tag-dk.npy" \
        --grad-v-out "$dir/$tag-dv.npy" $sinks_out
}
# check NAME TAG P SEED OFFSET y|yw|all: the files (Y; Y and the weights; Y and the
# gradients) against the reference with that dropout.
check() {
    "$python" "$work/ref.py" check "$1" "$work/$1" "$2" "$3" "$4" "$5" "$6" || fail=1
}
# same NAME TAG1 TAG2 FILES...: the runs wrote identical files.
same() {
    name=$1 a=$2 b=$3
    shift 3
    for n in "$@"; do
        if cmp -s "$work/$name/$a-$n.npy" "$work/$name/$b-$n.npy"; then
            echo "ok   $name: $a and $b wrote identical $n.npy"
        else
            echo "FAIL $name: $a and $b wrote different $n.npy"
            fail=1
        fi
    done
}

for name in gqa-causal mqa-window-softcap-sinks; do
    mkdir -p "$work/$name"
    extra=$("$python" "$work/ref.py" gen "$name" "$work/$name") ||
        { echo "FAIL $name: gen"; exit 1; }
    # shellcheck disable=SC2086 # extra: the case's options, paths without spaces
    set -- $extra
    drop="--dropout 0.3 --seed 12345 --dropout-offset 7"
    offset=7
    if [ "$name" = mqa-window-softcap-sinks ]; then # streams carry into the high word
        drop="--dropout 0.3 --seed 12345 --dropout-offset 4294967295"
        offset=4294967295
    fi
    # shellcheck disable=SC2086 # drop: options
    backward "$name" bwd "$@" $drop && check "$name" bwd 0.3 12345 $offset all
    # the forward alone (its own kernel choice, no lse)
    # shellcheck disable=SC2086
    sdpa "$name" fwd "$@" $drop --out "$work/$name/fwd-y.npy" &&
        check "$name" fwd 0.3 12345 $offset y
    [ "$name" = gqa-causal ] || continue
    # the unfused path (the weights materialised, then dropped), and those weights
    # shellcheck disable=SC2086
    sdpa "$name" unfused "$@" $drop --path unfused --out "$work/$name/unfused-y.npy" \
        --qk-output-mode 3 --qk-out "$work/$name/unfused-w.npy" &&
        check "$name" unfused 0.3 12345 $offset yw
    # the same seed again: the same bits, forward and backward
    # shellcheck disable=SC2086
    backward "$name" bwd2 "$@" $drop && same "$name" bwd bwd2 y dq dk dv
    # no --seed: the documented default 0, another mask than 12345's
    sdpa "$name" seed0 "$@" --dropout 0.3 --dropout-offset 7 --out "$work/$name/seed0-y.npy" &&
        check "$name" seed0 0.3 0 7 y &&
        { "$python" "$work/ref.py" differ "$work/$name/fwd-y.npy" "$work/$name/seed0-y.npy" ||
            fail=1; }
    # --seed without --dropout, and with --dropout 0: no dropout at all
    sdpa "$name" noseed "$@" --seed 99 --dropout-offset 3 --out "$work/$name/noseed-y.npy" &&
        check "$name" noseed 0 0 0 y
    sdpa "$name" p0 "$@" --dropout 0 --seed 5 --out "$work/$name/p0-y.npy" &&
        same "$name" noseed p0 y
    # P = 1: every weight zeroed, Y = 0
    sdpa "$name" p1 "$@" --dropout 1 --seed 12345 --out "$work/$name/p1-y.npy" &&
        check "$name" p1 1 12345 0 y
done

# bench --dropout: the attention and backward rows say so (a small case, one run).
if "$clattn" bench --op attention,backward --path fused --batch 1 --heads 2 --head-dim 16 \
    --seq 40 --runs 1 --warmup 0 --json --dropout 0.25 >"$work/out.txt" 2>"$work/err.txt" &&
    [ "$(grep -c '"dropout": 0.25' "$work/out.txt")" -eq 2 ] &&
    ! grep -q refused "$work/out.txt"; then
    echo "ok   bench --dropout 0.25: attention and backward rows"
else
    echo "FAIL bench --dropout 0.25:"
    cat "$work/out.txt" "$work/err.txt"
    fail=1
fi

# Refusals: status 2 and one line naming the option.
refuse() { # name, a word the line must hold, then the command's arguments
    name=$1 word=$2
    shift 2
    cli_refuse "$name" 2 "$word" "$work/never.npy" "$@"
}
d=$work/gqa-causal
io="--q $d/q.npy --k $d/k.npy --v $d/v.npy --out $work/never.npy"
# shellcheck disable=SC2086 # io: options and paths without spaces
{
    refuse dropout-1.5 --dropout sdpa $io --dropout 1.5
    refuse dropout-abc --dropout sdpa $io --dropout abc
    refuse dropout-negative --dropout sdpa $io --dropout -0.1
    refuse dropout-nan --dropout sdpa $io --dropout nan
    refuse seed-negative --seed sdpa $io --dropout 0.3 --seed -1
    refuse seed-garbage --seed sdpa $io --dropout 0.3 --seed 12x
    refuse seed-overflow --seed sdpa $io --dropout 0.3 --seed 18446744073709551616
    refuse offset-negative --dropout-offset sdpa $io --dropout 0.3 --dropout-offset -7
    refuse dropout-kv-dtype --kv-dtype sdpa $io --dropout 0.3 --kv-dtype q8_0
    refuse dropout-backward-1.5 --dropout sdpa $io --dropout 1.5 --backward \
        --grad-out "$d/do.npy" --grad-q-out "$work/never.npy"
    refuse bench-dropout --dropout bench --op backward --dropout 2
}
exit $fail
