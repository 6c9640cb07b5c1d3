"""clattn.scaled_dot_product_attention against a float64 numpy reference (always) and PyTorch's
CPU scaled_dot_product_attention (when torch is installed), on fresh random inputs at awkward
sizes, both paths; property tests over shapes and masks with hypothesis (when installed); bad
inputs raise, never crash. Run: pytest tests/python (CLATTN_LIBRARY may point at a build's
libclattn.so; CLATTN_DEVICE picks the device)."""

import math

import numpy as np
import pytest

import clattn

PATHS = ["fused", "unfused"]


def reference(q, k, v, mask=None, causal=False, scale=None, gqa=False, sinks=None):
    """float64 attention with PyTorch's meanings; fully masked rows give zeros (clattn's
    rule; PyTorch gives NaN there). sinks (Hq,): each head's logit joins its rows' softmax
    denominator (GPT-OSS's attention sinks; -inf: none)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    keep = np.ones(s.shape, dtype=bool)
    if causal:
        L, S = s.shape[-2:]
        keep &= np.tril(np.ones((L, S), dtype=bool))
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            keep &= np.broadcast_to(m, s.shape)
        else:
            s = s + m.astype(np.float64)
            keep &= np.isfinite(s)
    s = np.where(keep, s, -np.inf)
    mx = np.max(s, axis=-1, keepdims=True)
    sink = None
    if sinks is not None:  # (Hq,) -> (..., Hq, 1, 1)
        sink = np.asarray(sinks, dtype=np.float64).reshape(-1, 1, 1)
        mx = np.maximum(mx, sink)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.where(keep, np.exp(s - mx), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - mx)
    w = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    return np.matmul(w, v)


def rand(rng, *shape, dtype=np.float32):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


@pytest.fixture(scope="module")
def ctx():
    with clattn.Context() as context:
        yield context


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [
    ((1, 1, 1, 1), (1, 1, 1, 1)),
    ((2, 3, 17, 8), (2, 3, 23, 8)),
    ((1, 4, 63, 64), (1, 4, 65, 64)),
    ((3, 2, 129, 17), (3, 2, 127, 17)),
    ((5, 7), (11, 7)),              # (L, E)
    ((3, 5, 6), (3, 9, 6)),          # (N, L, E)
    ((2, 2, 3, 5, 8), (2, 2, 3, 7, 8)),  # two batch dims
])
def test_shapes(ctx, path, shape):
    rng = np.random.default_rng(hash(shape) % 2**32)
    q, k, v = rand(rng, *shape[0]), rand(rng, *shape[1]), rand(rng, *shape[1])
    out = clattn.scaled_dot_product_attention(q, k, v, ctx=ctx, path=path)
    assert out.shape == q.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(q, k, v), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("path", PATHS)
def test_causal_scale_gqa(ctx, path):
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, 2, 8, 31, 16), rand(rng, 2, 2, 31, 16), rand(rng, 2, 2, 31, 16)
    out = clattn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7,
                                              enable_gqa=True, ctx=ctx, path=path)
    np.testing.assert_allclose(out, reference(q, k, v, causal=True, scale=0.7, gqa=True),
                               rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("path", PATHS)
def test_positional_order_is_torchs(ctx, path):
    # torch's order: (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa).
    # (q, k, v, None, 0.0, True) is causal attention; clattn once read 0.0 as is_causal and
    # True as the scale (a result 2.49 off torch's).
    rng = np.random.default_rng(11)
    q, k, v = rand(rng, 2, 4, 17, 8), rand(rng, 2, 2, 17, 8), rand(rng, 2, 2, 17, 8)
    sdpa = clattn.scaled_dot_product_attention
    got = sdpa(q, k[:, :1].repeat(4, 1), v[:, :1].repeat(4, 1), None, 0.0, True, ctx=ctx,
               path=path)
    want = reference(q, k[:, :1].repeat(4, 1), v[:, :1].repeat(4, 1), causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    got = sdpa(q, k, v, None, 0.0, True, 0.3, True, ctx=ctx, path=path)
    np.testing.assert_allclose(got, reference(q, k, v, causal=True, scale=0.3, gqa=True),
                               rtol=1e-5, atol=2e-6)
    keyword = sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=0.3,
                   enable_gqa=True, ctx=ctx, path=path)
    np.testing.assert_array_equal(got, keyword)
    mask = rng.random((17, 17)) < 0.7
    got = sdpa(q, k, v, mask, 0.0, False, None, True, ctx=ctx, path=path)
    np.testing.assert_allclose(got, reference(q, k, v, mask=mask, gqa=True), rtol=1e-5,
                               atol=2e-6)


def test_dropout_and_keyword_only_extras(ctx):
    rng = np.random.default_rng(12)
    q = rand(rng, 1, 2, 5, 4)
    # dropout on numpy inputs needs its seed (test_dropout.py checks dropout itself)
    with pytest.raises(clattn.ArgumentError, match="dropout_seed"):
        clattn.scaled_dot_product_attention(q, q, q, None, 0.1)
    with pytest.raises(clattn.ArgumentError, match="dropout_seed"):
        clattn.scaled_dot_product_attention(q, q, q, dropout_p=0.5, ctx=ctx)
    for bad in (-0.5, 1.5, True, "0.1"):
        with pytest.raises(clattn.ArgumentError, match="dropout_p"):
            clattn.scaled_dot_product_attention(q, q, q, None, bad, ctx=ctx)
    # ctx and path are keyword-only: a 9th positional argument is refused, not taken as ctx
    with pytest.raises(TypeError):
        clattn.scaled_dot_product_attention(q, q, q, None, 0.0, False, None, False, ctx)
    out = clattn.scaled_dot_product_attention(q, q, q, None, 0, ctx=ctx)  # an int 0 is fine
    np.testing.assert_allclose(out, reference(q, q, q), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("heads", [(8, 2), (6, 3), (4, 2)])
def test_divisor_heads_need_enable_gqa(ctx, heads):
    # As torch: key/value heads that divide the query's (grouped-query shapes) still raise
    # without enable_gqa=True, also after the same shapes ran with it (the call cache keys
    # include enable_gqa), and whether it is left out or passed as False.
    hq, hkv = heads
    rng = np.random.default_rng(hq * 10 + hkv)
    q, k, v = rand(rng, 2, hq, 5, 8), rand(rng, 2, hkv, 7, 8), rand(rng, 2, hkv, 7, 8)
    out = clattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, ctx=ctx)
    np.testing.assert_allclose(out, reference(q, k, v, gqa=True), rtol=1e-5, atol=2e-6)
    for call in (lambda: clattn.scaled_dot_product_attention(q, k, v, ctx=ctx),
                 lambda: clattn.scaled_dot_product_attention(q, k, v, enable_gqa=False,
                                                             ctx=ctx)):
        with pytest.raises(clattn.ArgumentError, match="enable_gqa"):
            call()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("mask_shape", [(13, 29), (1, 13, 29), (2, 1, 13, 29), (29,),
                                        (2, 4, 13, 29)])
def test_masks(ctx, path, kind, mask_shape):
    rng = np.random.default_rng(2)
    q, k, v = rand(rng, 2, 4, 13, 8), rand(rng, 2, 4, 29, 8), rand(rng, 2, 4, 29, 8)
    if kind == "bool":
        mask = rng.random(mask_shape) < 0.7
    else:
        mask = rng.uniform(-1, 1, mask_shape).astype(np.float32)
        mask[rng.random(mask_shape) < 0.2] = -np.inf
    out = clattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, ctx=ctx, path=path)
    np.testing.assert_allclose(out, reference(q, k, v, mask=mask), rtol=1e-5, atol=2e-6)


def test_fully_masked_rows_are_zero(ctx):
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 1, 1, 4, 8), rand(rng, 1, 1, 6, 8), rand(rng, 1, 1, 6, 8)
    mask = np.ones((4, 6), dtype=bool)
    mask[2] = False
    out = clattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, ctx=ctx)
    assert np.all(out[0, 0, 2] == 0.0)
    np.testing.assert_allclose(out, reference(q, k, v, mask=mask), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtypes(ctx, dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dt = np.dtype(ml_dtypes.bfloat16)
        tol = 2e-2
    else:
        dt = np.dtype(dtype)
        tol = 2e-3 if dtype == "float16" else 1e-5
    rng = np.random.default_rng(4)
    q, k, v = (rand(rng, 2, 3, 19, 16).astype(dt) for _ in range(3))
    out = clattn.scaled_dot_product_attention(q, k, v, ctx=ctx)
    assert out.dtype == dt
    want = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("call, error", [
    (lambda q: clattn.scaled_dot_product_attention(q, q[:, :3], q[:, :3]), clattn.ArgumentError),
    (lambda q: clattn.scaled_dot_product_attention(q, q[..., :5], q), clattn.ArgumentError),
    (lambda q: clattn.scaled_dot_product_attention(q[0, 0, 0], q, q), clattn.ArgumentError),
    (lambda q: clattn.scaled_dot_product_attention(q, q, q, path="fast"), clattn.ArgumentError),
    (lambda q: clattn.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 3), bool),
                                                   is_causal=True), clattn.ArgumentError),
    (lambda q: clattn.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((4, 9), bool)),
     clattn.ArgumentError),
    (lambda q: clattn.scaled_dot_product_attention(q.astype(np.int32), q, q), TypeError),
    (lambda q: clattn.scaled_dot_product_attention(q, q, q, scale=float("inf")),
     clattn.ArgumentError),
])
def test_bad_inputs_raise(ctx, call, error):
    q = np.ones((2, 4, 7, 8), dtype=np.float32)
    with pytest.raises(error) as info:
        call(q)
    assert str(info.value)


def test_errors_carry_the_library_message(ctx):
    q = np.ones((1, 1, 3, 600), dtype=np.float32)
    with pytest.raises(clattn.DeviceError) as info:  # head size 600: no fused kernel
        clattn.scaled_dot_product_attention(q, q, q, ctx=ctx, path="fused")
    assert info.value.status_name.startswith("CLATTN_ERR")
    assert "576" in str(info.value)


def test_context_device_spec():
    with pytest.raises(clattn.DeviceError):
        clattn.Context("99:99")


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), h=st.integers(1, 4), lq=st.integers(1, 40), lk=st.integers(1, 40),
       d=st.integers(1, 32), causal=st.booleans(), mask=st.sampled_from([None, "bool", "float"]),
       path=st.sampled_from(PATHS), seed=st.integers(0, 2**31))
def test_property_random_problems(b, h, lq, lk, d, causal, mask, path, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rand(rng, b, h, lq, d), rand(rng, b, h, lk, d), rand(rng, b, h, lk, d)
    m = None
    if mask == "bool":
        m = rng.random((lq, lk)) < 0.6
    elif mask == "float":
        m = rng.uniform(-2, 2, (1, h, lq, lk)).astype(np.float32)
    if m is not None:
        causal = False
    out = clattn.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, path=path)
    np.testing.assert_allclose(out, reference(q, k, v, mask=m, causal=causal), rtol=1e-5,
                               atol=2e-6)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["none", "bool", "float"])
def test_repeated_calls_reuse_the_prepared_plan(path, kind):
    # The second and later calls of one shape take the prepared path (staging buffers kept
    # with the plan): fresh data each time, outputs compared every time, and a change of
    # shape, dtype or layout in between must not reuse the wrong entry.
    rng = np.random.default_rng(7)
    with clattn.Context() as ctx:
        for step in range(4):
            q, k, v = rand(rng, 2, 3, 17, 8), rand(rng, 2, 3, 29, 8), rand(rng, 2, 3, 29, 5)
            mask = None
            if kind == "bool":
                mask = rng.random((17, 29)) < 0.6
            elif kind == "float":
                mask = rng.standard_normal((3, 17, 29)).astype(np.float32)
            out = clattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, ctx=ctx,
                                                      path=path)
            np.testing.assert_allclose(out, reference(q, k, v, mask=mask), rtol=1e-5,
                                       atol=2e-6)
            # same shapes, a transposed (non-contiguous) key: a different entry
            kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
            out = clattn.scaled_dot_product_attention(q, kt, v, attn_mask=mask, ctx=ctx,
                                                      path=path)
            np.testing.assert_allclose(out, reference(q, k, v, mask=mask), rtol=1e-5,
                                       atol=2e-6)
            # rank 2 inputs of the same data, and float16
            out = clattn.scaled_dot_product_attention(q[0, 0], k[0, 0], v[0, 0], ctx=ctx,
                                                      path=path)
            np.testing.assert_allclose(out, reference(q[0, 0], k[0, 0], v[0, 0]), rtol=1e-5,
                                       atol=2e-6)
            h = [a.astype(np.float16) for a in (q, k, v)]
            out = clattn.scaled_dot_product_attention(*h, ctx=ctx, path=path)
            assert out.dtype == np.float16
            np.testing.assert_allclose(out.astype(np.float64), reference(*h), rtol=3e-3,
                                       atol=3e-3)
        # the input arrays are read, never written
        q0 = q.copy()
        clattn.scaled_dot_product_attention(q, k, v, ctx=ctx, path=path)
        assert np.array_equal(q, q0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_sinks(ctx, path, causal):
    """Attention sinks (one logit per query head, one of them -inf) with grouped heads and
    causal masking; then through torch tensors when torch is there; bad sinks raise."""
    rng = np.random.default_rng(28)
    q, k, v = rand(rng, 2, 4, 17, 16), rand(rng, 2, 2, 23, 16), rand(rng, 2, 2, 23, 8)
    sinks = rng.uniform(-1, 3, size=4).astype(np.float32)
    sinks[2] = -np.inf
    got = clattn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True,
                                              ctx=ctx, path=path, sinks=sinks)
    want = reference(q, k, v, causal=causal, gqa=True, sinks=sinks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # the rows' weights sum to less than 1: without sinks the result differs
    plain = clattn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True,
                                                ctx=ctx, path=path)
    assert np.abs(plain - got).max() > 1e-3
    for bad, error in [(sinks[:3], clattn.ArgumentError),
                       (np.full(4, np.nan, np.float32), clattn.ArgumentError)]:
        with pytest.raises(error):
            clattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, ctx=ctx, sinks=bad)


@pytest.mark.parametrize("path", PATHS)
def test_sinks_torch(ctx, path):
    """Sinks as a torch tensor, with torch inputs (torch in, torch out)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(29)
    q, k, v = rand(rng, 2, 4, 17, 16), rand(rng, 2, 2, 23, 16), rand(rng, 2, 2, 23, 8)
    sinks = rng.uniform(-1, 3, size=4).astype(np.float32)
    causal = True
    want = reference(q, k, v, causal=causal, gqa=True, sinks=sinks)
    got_t = clattn.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), is_causal=causal,
        enable_gqa=True, ctx=ctx, path=path, sinks=torch.from_numpy(sinks))
    np.testing.assert_allclose(got_t.numpy(), want, rtol=1e-4, atol=1e-5)


def paged_problem(rng, B=3, Hq=4, Hkv=2, Lq=3, E=16, Ev=8, page_size=5, blocks=4):
    """Random pools of pages in a shuffled order with NaN in every unused slot, a block table
    (-1 past each sequence's keys) and counts; also the keys and values laid out contiguously."""
    S = page_size * blocks
    k, v = rand(rng, B, Hkv, S, E), rand(rng, B, Hkv, S, Ev)
    counts = np.array([13, S, 1][:B], dtype=np.int64)
    pages = B * blocks + 2
    order = rng.permutation(pages)
    table = np.full((B, blocks), -1, dtype=np.int32)
    kp = np.full((pages, page_size, Hkv, E), np.nan, np.float32)
    vp = np.full((pages, page_size, Hkv, Ev), np.nan, np.float32)
    for b in range(B):
        for blk in range((counts[b] + page_size - 1) // page_size):
            table[b, blk] = order[b * blocks + blk]
        for j in range(counts[b]):
            kp[table[b, j // page_size], j % page_size] = k[b, :, j]
            vp[table[b, j // page_size], j % page_size] = v[b, :, j]
    return rand(rng, B, Hq, Lq, E), k, v, kp, vp, table, counts


@pytest.mark.parametrize("causal", [False, True])
def test_paged_attention(ctx, causal):
    """clattn.paged_attention equals attention over the same keys laid out contiguously (each
    sequence's first counts[b] keys), with grouped heads, bottom-right causal masking and
    sinks; bad tables and counts raise naming the argument."""
    rng = np.random.default_rng(30)
    q, k, v, kp, vp, table, counts = paged_problem(rng)
    sinks = rng.uniform(-1, 2, size=4).astype(np.float32)
    got = clattn.paged_attention(q, kp, vp, table, counts, is_causal=causal, sinks=sinks, ctx=ctx)
    for b in range(q.shape[0]):
        n = int(counts[b])
        keep = np.ones((q.shape[2], n), dtype=bool)
        if causal:  # the queries are the last rows of the sequence
            keep = np.tril(keep, k=n - q.shape[2])
        want = reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], mask=keep, gqa=True,
                         sinks=sinks)
        np.testing.assert_allclose(got[b:b + 1], want, rtol=1e-4, atol=1e-5)
    bad = table.copy()
    bad[0, 1] = kp.shape[0]
    with pytest.raises(clattn.ArgumentError, match=r"block_table\[0, 1\]"):
        clattn.paged_attention(q, kp, vp, bad, counts, ctx=ctx)
    with pytest.raises(clattn.ArgumentError, match=r"seqlens_k\[1\] = 21"):
        clattn.paged_attention(q, kp, vp, table, counts + np.array([0, 1, 0]), ctx=ctx)


def varlen_problem(rng, lq=(5, 0, 17, 1), lk=(9, 3, 17, 40), hq=4, hkv=2, e=16, ev=8):
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int64)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    return (rand(rng, int(cq[-1]), hq, e), rand(rng, int(ck[-1]), hkv, e),
            rand(rng, int(ck[-1]), hkv, ev), cq, ck)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention(ctx, causal):
    """clattn.varlen_attention equals each sequence run alone (an empty one and one of a
    single row among them), with grouped heads, bottom-right causal masking, a window and sinks;
    torch tensors give a torch tensor; offsets that are not from 0, non-decreasing and ending at
    the totals raise naming the argument."""
    rng = np.random.default_rng(28)
    q, k, v, cq, ck = varlen_problem(rng)
    sinks = rng.uniform(-1, 2, size=4).astype(np.float32)
    window = (6, 0) if causal else (-1, -1)
    got = clattn.varlen_attention(q, k, v, cq, ck, causal=causal, window_size=window,
                                  sinks=sinks, ctx=ctx)
    assert got.shape == (q.shape[0], 4, 8)
    for b in range(len(cq) - 1):
        nq, nk = int(cq[b + 1] - cq[b]), int(ck[b + 1] - ck[b])
        if nq == 0:
            continue
        keep = np.ones((nq, nk), dtype=bool)
        if causal:  # the queries are the sequence's last rows; 6 keys to the left at most
            keep = np.tril(keep, k=nk - nq) & ~np.tril(keep, k=nk - nq - 7)
        qs, ks, vs = (np.swapaxes(a[c[b]:c[b + 1]], 0, 1)[None]
                      for a, c in ((q, cq), (k, ck), (v, ck)))
        want = reference(qs, ks, vs, mask=keep, gqa=True, sinks=sinks)[0]
        np.testing.assert_allclose(np.swapaxes(got[cq[b]:cq[b + 1]], 0, 1), want, rtol=1e-4,
                                   atol=1e-5)
    with pytest.raises(clattn.ArgumentError, match=r"cu_seqlens_q\[2\] = 4 is below"):
        clattn.varlen_attention(q, k, v, np.array([0, 5, 4, 22, 23]), ck, ctx=ctx)
    with pytest.raises(clattn.ArgumentError, match=r"cu_seqlens_k\[4\] = 68 but there are 69"):
        clattn.varlen_attention(q, k, v, cq, np.array([0, 9, 12, 29, 68]), ctx=ctx)
    with pytest.raises(clattn.ArgumentError, match=r"cu_seqlens_q\[0\] = 1"):
        clattn.varlen_attention(q, k, v, np.array([1, 5, 5, 22, 23]), ck, ctx=ctx)
    with pytest.raises(clattn.ArgumentError, match=r"cu_seqlens_k has shape \(3,\)"):
        clattn.varlen_attention(q, k, v, cq, np.array([0, 9, 69]), ctx=ctx)
    with pytest.raises(clattn.ArgumentError, match=r"max_seqlen_q=3"):
        clattn.varlen_attention(q, k, v, cq, ck, max_seqlen_q=3, ctx=ctx)

