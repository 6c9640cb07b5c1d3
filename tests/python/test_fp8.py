"""FP8 KV storage from Python (issue 50, item 8): clattn.quantize into 'fp8_e4m3' /
'fp8_e5m2' against a numpy decode written from the OCP definition, paged_attention and
KVCache over fp8 pools with per-tensor scales against float64 attention over the decoded
values, torch.float8 pools where torch has them, and the refusals. The torch tests skip
without torch 2.1+ (the numpy ones run everywhere)."""

import numpy as np
import pytest

import clattn

FORMATS = {"fp8_e4m3": (3, 7, 448.0), "fp8_e5m2": (2, 15, 57344.0)}


def decode(codes, kind):
    """float64 values of uint8 codes (NaN codes give NaN, e5m2's infinities inf)."""
    mbits, bias, _ = FORMATS[kind]
    c = np.asarray(codes, np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exponent, mantissa = (c & 0x7f) >> mbits, c & ((1 << mbits) - 1)
    value = np.where(exponent == 0, np.ldexp(mantissa.astype(np.float64), 1 - bias - mbits),
                     np.ldexp(((1 << mbits) + mantissa).astype(np.float64),
                              exponent - bias - mbits))
    if kind == "fp8_e4m3":
        value = np.where((c & 0x7f) == 0x7f, np.nan, value)
    else:
        value = np.where(exponent == 31, np.where(mantissa == 0, np.inf, np.nan), value)
    return sign * value


def nearest(x, kind):
    """The round-to-nearest-even, saturating code's value of each float (a table search)."""
    table = decode(np.arange(128), kind)
    finite = np.isfinite(table)
    out = np.empty(np.shape(x))
    for i, v in enumerate(np.ravel(x)):
        if np.isnan(v):
            out.flat[i] = np.nan
            continue
        a = min(abs(float(v)), FORMATS[kind][2])
        err = np.where(finite, np.abs(table - a), np.inf)
        best = np.flatnonzero(err == err.min())
        c = best[0] if len(best) == 1 else best[best % 2 == 0][0]
        out.flat[i] = np.copysign(table[c], v)
    return out


def attention(q, k, v, lengths, causal=True):
    """float64 grouped attention of q (B, Hq, Lq, E) over k, v (B, Hkv, L, E) with per-batch key
    counts, bottom-right causal."""
    B, Hq, Lq, E = q.shape
    group = Hq // k.shape[1]
    out = np.zeros((B, Hq, Lq, v.shape[3]))
    for b in range(B):
        n = int(lengths[b])
        ks = np.repeat(k[b, :, :n], group, axis=0).astype(np.float64)
        vs = np.repeat(v[b, :, :n], group, axis=0).astype(np.float64)
        s = q[b].astype(np.float64) @ ks.transpose(0, 2, 1) * E ** -0.5
        if causal:
            s = np.where(np.tril(np.ones((Lq, n), bool), k=n - Lq), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        out[b] = (w / w.sum(-1, keepdims=True)) @ vs
    return out


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_quantize_codes(kind):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 41)) * np.exp2(rng.integers(-14, 12, (3, 41)))).astype(np.float32)
    x[0, :6] = [0.0, -0.0, np.nan, np.inf, -1e9, 1e-30]
    for scale in (None, 0.25):
        codes = clattn.quantize(x, kind, scale=scale)
        assert codes.dtype == np.uint8 and codes.shape == x.shape
        got = decode(codes, kind) * (scale or 1.0)
        want = nearest(x / np.float32(scale or 1.0), kind) * (scale or 1.0)
        want[0, 2] = np.nan
        if kind == "fp8_e5m2":
            want[0, 3] = np.inf  # e5m2 keeps infinities; e4m3 saturates them
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_paged_attention_fp8(kind):
    rng = np.random.default_rng(7)
    B, Hq, Hkv, Lq, E, Ev, page, blocks = 2, 4, 2, 3, 40, 24, 5, 4
    pages = B * blocks + 1
    q = rng.uniform(-1, 1, (B, Hq, Lq, E)).astype(np.float32)
    kp = rng.uniform(-3, 3, (pages, page, Hkv, E)).astype(np.float32)
    vp = rng.uniform(-1, 1, (pages, page, Hkv, Ev)).astype(np.float32)
    table = rng.permutation(pages)[:B * blocks].reshape(B, blocks).astype(np.int32)
    lengths = np.array([17, 9], np.int32)
    k_scale, v_scale = 0.5, 0.125
    out = clattn.paged_attention(q, kp, vp, table, lengths, is_causal=True, kv_dtype=kind,
                                 k_scale=k_scale, v_scale=v_scale)
    # the same codes given as uint8 pools
    kc = clattn.quantize(kp, kind, scale=k_scale)
    vc = clattn.quantize(vp, kind, scale=v_scale)
    out2 = clattn.paged_attention(q, kc, vc, table, lengths, is_causal=True, kv_dtype=kind,
                                  k_scale=k_scale, v_scale=v_scale)
    np.testing.assert_array_equal(out, out2)
    kd, vd = decode(kc, kind) * k_scale, decode(vc, kind) * v_scale
    # (pages, page, Hkv, E) through the table into (B, Hkv, L, E)
    k = kd[table].transpose(0, 3, 1, 2, 4).reshape(B, Hkv, blocks * page, E)
    v = vd[table].transpose(0, 3, 1, 2, 4).reshape(B, Hkv, blocks * page, Ev)
    np.testing.assert_allclose(out, attention(q, k, v, lengths), rtol=1e-4, atol=1e-5)
    kx = kp[table].transpose(0, 3, 1, 2, 4).reshape(B, Hkv, blocks * page, E)
    vx = vp[table].transpose(0, 3, 1, 2, 4).reshape(B, Hkv, blocks * page, Ev)
    exact = attention(q, kx, vx, lengths)
    bound = 0.25 if kind == "fp8_e4m3" else 0.5
    assert np.abs(out - exact).max() < bound * np.abs(exact).max()


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_kv_cache_fp8(kind):
    rng = np.random.default_rng(11)
    B, Hq, Hkv, cap, E = 1, 4, 1, 30, 16
    cache = clattn.KVCache(B, Hkv, cap, E, dtype=kind, page_size=4, k_scale=2.0, v_scale=0.5)
    keys = rng.uniform(-4, 4, (B, Hkv, cap, E)).astype(np.float32)
    values = rng.uniform(-1, 1, (B, Hkv, cap, E)).astype(np.float32)
    cache.append(keys[:, :, :13], values[:, :, :13])
    cache.append(keys[:, :, 13:14], values[:, :, 13:14])
    q = rng.uniform(-1, 1, (B, Hq, 1, E)).astype(np.float32)
    out = cache.attend(q)
    kd = decode(clattn.quantize(keys, kind, scale=2.0), kind) * 2.0
    vd = decode(clattn.quantize(values, kind, scale=0.5), kind) * 0.5
    np.testing.assert_allclose(out, attention(q, kd, vd, [14]), rtol=1e-4, atol=1e-5)
    cache.close()


def test_fp8_refusals():
    x = np.ones((2, 32), np.float32)
    with pytest.raises(clattn.ArgumentError, match="k_scale"):
        clattn.quantize(x, "q8_0", scale=2.0)
    with pytest.raises(clattn.ArgumentError, match="fp8_e5m2"):
        clattn.quantize(x, "fp8_e3m4")
    with pytest.raises(clattn.ArgumentError, match="finite"):
        clattn.quantize(x, "fp8_e4m3", scale=float("nan"))
    q = np.ones((1, 1, 1, 32), np.float32)
    pool = np.ones((1, 4, 1, 32), np.float32)
    table, n = np.zeros((1, 1), np.int32), np.array([3], np.int32)
    with pytest.raises(clattn.ArgumentError, match="v_scale"):
        clattn.paged_attention(q, pool, pool, table, n, kv_dtype="q8_0", v_scale=0.5)
    with pytest.raises(clattn.ArgumentError, match="k_scale"):
        clattn.KVCache(1, 1, 8, 32, dtype=np.float16, k_scale=2.0)


def _torch_fp8():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8 dtypes (2.1+)")
    return torch


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_torch_float8(kind):
    """torch.float8 pools are read as their codes (kv_dtype implied), and the codes of
    clattn.quantize are torch's own cast for values in range."""
    torch = _torch_fp8()
    tdtype = torch.float8_e4m3fn if kind == "fp8_e4m3" else torch.float8_e5m2
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.uniform(-300, 300, (4, 64)).astype(np.float32))
    assert torch.equal(torch.from_numpy(clattn.quantize(x.numpy(), kind)),
                       x.to(tdtype).view(torch.uint8))
    B, Hq, Hkv, E, page = 1, 2, 1, 32, 8
    q = torch.from_numpy(rng.uniform(-1, 1, (B, Hq, 1, E)).astype(np.float32))
    kp = torch.from_numpy(rng.uniform(-2, 2, (3, page, Hkv, E)).astype(np.float32))
    vp = torch.from_numpy(rng.uniform(-1, 1, (3, page, Hkv, E)).astype(np.float32))
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    n = torch.tensor([11], dtype=torch.int32)
    k8, v8 = (kp / 0.5).to(tdtype), (vp / 0.25).to(tdtype)
    out = clattn.paged_attention(q, k8, v8, table, n, is_causal=True, k_scale=0.5, v_scale=0.25)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    ref = clattn.paged_attention(q, k8.float() * 0.5, v8.float() * 0.25, table, n,
                                 is_causal=True)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def _cli():
    """The clattn CLI beside CLATTN_LIBRARY (a build tree), or skip."""
    import os
    lib = os.environ.get("CLATTN_LIBRARY", "")
    path = os.path.join(os.path.dirname(lib), "clattn")
    if not lib or not os.access(path, os.X_OK):
        pytest.skip("no clattn CLI beside CLATTN_LIBRARY")
    return path


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_cli_kv_dtype(kind, tmp_path):
    """clattn sdpa --kv-dtype fp8_* --k-scale --v-scale against float64 attention over the
    decoded values; a scale with float K refused."""
    import subprocess
    cli = _cli()
    rng = np.random.default_rng(13)
    q = rng.uniform(-1, 1, (1, 4, 3, 40)).astype(np.float32)
    k = rng.uniform(-2, 2, (1, 2, 19, 40)).astype(np.float32)
    v = rng.uniform(-1, 1, (1, 2, 19, 24)).astype(np.float32)
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", a)
    args = [cli, "sdpa", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
            "--v", str(tmp_path / "v.npy"), "--out", str(tmp_path / "o.npy")]
    done = subprocess.run(args + ["--kv-dtype", kind, "--k-scale", "0.5", "--v-scale", "0.25",
                                  "--causal", "--causal-align", "bottom-right"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    kd = decode(clattn.quantize(k, kind, scale=0.5), kind) * 0.5
    vd = decode(clattn.quantize(v, kind, scale=0.25), kind) * 0.25
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), attention(q, kd, vd, [19]),
                               rtol=1e-4, atol=1e-5)
    done = subprocess.run(args + ["--k-scale", "2"], capture_output=True, text=True)
    assert done.returncode != 0 and "k_scale" in done.stderr
