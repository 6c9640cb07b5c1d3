"""The float64 numpy reference of the CLI's attention tests (cli_backward_test.sh,
cli_dropout_test.sh): file layouts, Philox 4x32-10 and dropout's factors by clattn.h's rule,
and attention with its gradients. numpy only (the scripts run it with the system python)."""

import sys

import numpy as np


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


def save_inputs(c, name, d):
    """A case's q, k, v, dO (standard normal, seeded by its name) into d as files; the
    generator, for the case's further inputs."""
    r = np.random.default_rng(sum(map(ord, name)))
    shapes = {"q": (c["B"], c["Hq"], c["Lq"], c["dk"]), "k": (c["B"], c["Hkv"], c["Lk"], c["dk"]),
              "v": (c["B"], c["Hkv"], c["Lk"], c["dv"]), "do": (c["B"], c["Hq"], c["Lq"], c["dv"])}
    for n, s in shapes.items():
        np.save(f"{d}/{n}.npy", to_file(r.standard_normal(s).astype(np.float32), c["rank3"]))
    return r


def load_inputs(c, d):
    """q, k, v, dO of a case from d, as float64 (B, H, L, d)."""
    load = lambda n: from_file(np.load(f"{d}/{n}.npy").astype(np.float64),
                               c["Hkv"] if n in ("k", "v") else c["Hq"], c["rank3"])
    return load("q"), load("k"), load("v"), load("do")


M0, M1, MASK = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), np.uint64(0xFFFFFFFF)


def philox(c0, c1, c2, c3, seed):
    """Philox 4x32-10 of counters (broadcast arrays of 32-bit words) under key seed (64 bits:
    k0 the low word); the four output words as uint64 arrays."""
    c = np.broadcast_arrays(*[np.asarray(x, np.uint64) & MASK for x in (c0, c1, c2, c3)])
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]  # 32 x 32 -> 64 bits: no overflow in uint64
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & MASK,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & MASK]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c


def philox_self_test():  # Random123's known-answer vectors for philox4x32_10
    kat = [((0, 0, 0, 0), 0, (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, 0xffffffffffffffff,
            (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), 0x299f31d0a4093822,
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        got = tuple(int(x) for x in philox(*ctr, key))
        if got != want:
            print(f"FAIL numpy Philox: counter {ctr} key {key:#x} gives "
                  f"{[hex(x) for x in got]}, want {[hex(x) for x in want]}")
            sys.exit(1)
    print("ok   numpy Philox 4x32-10: Random123's 3 known-answer vectors")


def dropout_factor(p, seed, offset, B, H, Lq, Lk):
    """(B, H, Lq, Lk) factors: 1 / (1 - p) where kept, 0 where dropped (p = 0: all 1)."""
    if p == 0.0:
        return np.ones((B, H, Lq, Lk))
    threshold = min(int(np.floor(p * 4294967296.0)), 0xFFFFFFFF)
    stream = [(offset + s) % (1 << 64) for s in range(B * H)]  # N + b * Hq + h, 64-bit
    lo = np.array([s & 0xFFFFFFFF for s in stream], np.uint64).reshape(B, H, 1, 1)
    hi = np.array([s >> 32 for s in stream], np.uint64).reshape(B, H, 1, 1)
    j, i = np.arange(Lk, dtype=np.uint64), np.arange(Lq, dtype=np.uint64)[:, None]
    words = np.stack(np.broadcast_arrays(*philox(j >> np.uint64(2), i, lo, hi, seed)), -1)
    u = np.take_along_axis(words, (np.arange(Lk) % 4)[None, None, None, :, None], -1)[..., 0]
    return np.where(u >= threshold, 1.0 / (1.0 - p) if p < 1.0 else 0.0, 0.0)


def attention(c, q, k, v, do, mask=None, sinks=None, factor=None):
    """Y and the gradients (dq, dk, dv; dmask, dsinks when given) of a case c's attention: the
    keys' rules from c (scale, softcap, causal offset, window, ALiBi), a float (Lq, width)
    mask padded to Lk as masked, sinks (Hq,), dropout's factors (B, Hq, Lq, Lk) after the
    softmax (whose normaliser is the undropped row's); "w": the weights that met V."""
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
        pos, (left, right) = i + c["offset"], c["window"]
        keep &= (j >= pos - left) & (j <= pos + right)
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
    D = np.ones_like(P) if factor is None else factor
    Pd = P * D
    O = Pd @ V
    dV = np.einsum("bhij,bhid->bhjd", Pd, do)
    dP = (do @ V.transpose(0, 1, 3, 2)) * D
    delta = (do * O).sum(-1, keepdims=True)  # = rowsum(P dP): dropout keeps the identity
    dS = P * (dP - delta)
    dx = dS * (1.0 - t * t) if cap else dS
    dQ = scale * dx @ K
    dK = scale * np.einsum("bhij,bhid->bhjd", dx, q)
    grads = {"y": O, "dq": dQ, "dk": dK.reshape(B, -1, g, Lk, dk).sum(2),
             "dv": dV.reshape(B, -1, g, Lk, V.shape[-1]).sum(2), "w": Pd}
    if mask is not None:
        grads["dmask"] = dS.sum((0, 1))[:, :mask.shape[1]]
    if sinks is not None:
        grads["dsinks"] = -(np.exp(sinks[None, :, None, None] - m) / z * delta).sum((0, 2, 3))
    return grads


def compare(label, n, got, ref):
    """One output against the reference: shape, finite, max error within 1e-4 of max |ref|
    (+ 1e-6); prints an ok/FAIL line and returns whether it passed."""
    if got.shape != ref.shape:
        print(f"FAIL {label}: {n} has shape {got.shape}, want {ref.shape}")
        return False
    err = float(np.max(np.abs(got - ref)))
    bound = 1e-4 * float(np.max(np.abs(ref))) + 1e-6
    ok = err <= bound and bool(np.all(np.isfinite(got)))
    print(f"{'ok  ' if ok else 'FAIL'} {label}: {n} {got.shape} max err {err:.3g} "
          f"(bound {bound:.3g})")
    return ok
