"""Issue 46's findings on varlen_attention and paged_attention, each a test that failed before
the fix: paged_attention's torch branch dropped kv_dtype, both functions dropped autograd,
varlen_attention did not take flash_attn_varlen_func's positional order, and a flash-attn
(B, Lq, H, D) query in paged_attention got no hint. The torch tests skip without torch (the
numpy ones run everywhere)."""

import numpy as np
import pytest

import clattn


def rand(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def varlen_reference(q, k, v, cq, ck, causal=False, scale=None):
    """float64 packed attention, each sequence alone, bottom-right causal; rows with no key
    give zeros (clattn's rule)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    group = q.shape[1] // k.shape[1]
    for b in range(len(cq) - 1):
        nq, nk = int(cq[b + 1] - cq[b]), int(ck[b + 1] - ck[b])
        qs = q[cq[b]:cq[b + 1]].transpose(1, 0, 2)
        ks = np.repeat(k[ck[b]:ck[b + 1]].transpose(1, 0, 2), group, axis=0)
        vs = np.repeat(v[ck[b]:ck[b + 1]].transpose(1, 0, 2), group, axis=0)
        s = qs @ ks.transpose(0, 2, 1) * (scale or q.shape[2] ** -0.5)
        keep = np.ones((nq, nk), bool)
        if causal:
            keep = np.tril(keep, k=nk - nq)
        s = np.where(keep, s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True)
        w = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
        w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
        out[cq[b]:cq[b + 1]] = (w @ vs).transpose(1, 0, 2)
    return out


def varlen_problem(rng):
    cq = np.array([0, 3, 4, 11], np.int32)   # lengths 3, 1, 7
    ck = np.array([0, 5, 17, 19], np.int32)  # lengths 5, 12, 2 (Lq > Lk in the last)
    return rand(rng, 11, 4, 16), rand(rng, 19, 2, 16), rand(rng, 19, 2, 8), cq, ck


def test_varlen_takes_flash_attn_positional_order():
    """flash_attn_varlen_func's order: (q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k,
    dropout_p, softmax_scale, causal, ...) was a TypeError at the 6th argument."""
    rng = np.random.default_rng(46)
    q, k, v, cq, ck = varlen_problem(rng)
    got = clattn.varlen_attention(q, k, v, cq, ck, 12, 12)
    np.testing.assert_allclose(got, varlen_reference(q, k, v, cq, ck), rtol=1e-5, atol=2e-6)
    got = clattn.varlen_attention(q, k, v, cq, ck, 7, 12, 0.0, 0.3, True)
    want = varlen_reference(q, k, v, cq, ck, causal=True, scale=0.3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    kw = clattn.varlen_attention(q, k, v, cq, ck, softmax_scale=0.3, causal=True, dropout_p=0.0)
    np.testing.assert_allclose(kw, got, rtol=0, atol=0)
    alias = clattn.varlen_attention(q, k, v, cq, ck, scale=0.3, causal=True)  # older keyword
    np.testing.assert_allclose(alias, got, rtol=0, atol=0)
    out, lse, probs = clattn.varlen_attention(q, k, v, cq, ck, return_attn_probs=True)
    assert lse.shape == (4, 11) and lse.dtype == np.float32 and probs is None
    with pytest.raises(clattn.ArgumentError, match="dropout_p=0.1.*packed"):
        clattn.varlen_attention(q, k, v, cq, ck, 7, 12, 0.1)
    with pytest.raises(clattn.ArgumentError, match="softmax_scale and scale"):
        clattn.varlen_attention(q, k, v, cq, ck, softmax_scale=0.3, scale=0.3)


def test_paged_rejects_flash_attn_query_layout():
    """paged_attention takes (B, Hq, Lq, E); a flash-attn query (B, Lq, H, D) with Lq not a
    multiple of the pools' heads is refused with a hint naming the layout (no hint before)."""
    rng = np.random.default_rng(3)
    kp, vp = rand(rng, 4, 4, 2, 16), rand(rng, 4, 4, 2, 16)
    table, counts = np.array([[0, 1], [2, 3]], np.int32), np.array([5, 8], np.int32)
    flash_q = rand(rng, 2, 3, 4, 16)  # (B, Lq=3, H=4, D)
    with pytest.raises(clattn.ArgumentError, match=r"flash-attn's \(B, Lq, H, D\)"):
        clattn.paged_attention(flash_q, kp, vp, table, counts)


# --- torch --------------------------------------------------------------------------------

def paged_pools(rng, d):
    kp, vp = rand(rng, 5, 3, 2, d), rand(rng, 5, 3, 2, d)
    table = np.array([[4, 0, 2], [1, 3, 0]], np.int32)
    counts = np.array([7, 5], np.int32)
    return rand(rng, 2, 4, 2, d), kp, vp, table, counts


def test_paged_kv_dtype_reaches_the_core_on_torch():
    """The torch branch forwarded no kv_dtype: 'q8_0', 'q4_0' and 'bogus' all gave the float
    result at D=16. Now torch and numpy give the same result or the same error."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    q, kp, vp, table, counts = paged_pools(rng, 16)
    t = [torch.from_numpy(a) for a in (q, kp, vp, table, counts)]
    for kind in ("q8_0", "q4_0", "bogus"):
        with pytest.raises(clattn.ArgumentError) as numpy_error:
            clattn.paged_attention(q, kp, vp, table, counts, kv_dtype=kind)
        with pytest.raises(clattn.ArgumentError) as torch_error:
            clattn.paged_attention(*t, kv_dtype=kind)
        assert str(torch_error.value) == str(numpy_error.value)
    q, kp, vp, table, counts = paged_pools(rng, 32)
    t = [torch.from_numpy(a) for a in (q, kp, vp, table, counts)]
    plain = clattn.paged_attention(q, kp, vp, table, counts, is_causal=True)
    for kind in ("q8_0", "q4_0"):
        want = clattn.paged_attention(q, kp, vp, table, counts, is_causal=True, kv_dtype=kind)
        got = clattn.paged_attention(*t, is_causal=True, kv_dtype=kind)
        assert isinstance(got, torch.Tensor)
        np.testing.assert_array_equal(got.numpy(), want)
        assert np.abs(want - plain).max() > 1e-4  # quantized: not the float result


def test_paged_refuses_grad_instead_of_detaching():
    """paged_attention on tensors requiring grad returned requires_grad=False; now it raises
    naming what is not differentiable (and runs under no_grad)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    q, kp, vp, table, counts = (torch.from_numpy(a) for a in paged_pools(rng, 16))
    q.requires_grad_(True)
    with pytest.raises(clattn.ArgumentError, match="paged_attention is not differentiable: "
                                                   "query requires grad"):
        clattn.paged_attention(q, kp, vp, table, counts)
    with torch.no_grad():
        out = clattn.paged_attention(q, kp, vp, table, counts)
    assert not out.requires_grad and tuple(out.shape) == (2, 4, 2, 16)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_varlen_autograd(dtype):
    """varlen_attention returned requires_grad=False from inputs requiring grad; now its
    result is differentiable through clattn's packed backward (GQA, bottom-right causal, a
    window, softcap, ALiBi and sinks), matching float64 torch autograd of the reference."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    q, k, v, cq, ck = varlen_problem(rng)
    dt = getattr(torch, dtype)
    qt, kt, vt = (torch.tensor(a, dtype=dt, requires_grad=True) for a in (q, k, v))
    sinks = torch.tensor([0.5, -1.0, 0.2, 1.0], dtype=torch.float32, requires_grad=True)
    slopes = torch.tensor([0.1, 0.2, 0.05, 0.3])
    out = clattn.varlen_attention(qt, kt, vt, torch.from_numpy(cq), torch.from_numpy(ck),
                                  max_seqlen_q=7, max_seqlen_k=12, causal=True,
                                  window_size=(4, 0), softcap=2.0,
                                  alibi_slopes=slopes, sinks=sinks)
    assert out.requires_grad and out.dtype == dt
    grad = torch.from_numpy(rand(rng, *out.shape)).to(dt)
    out.backward(grad)

    rq, rk, rv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    rs = sinks.detach().double().requires_grad_(True)
    outs = []
    for b in range(3):
        nq, nk = int(cq[b + 1] - cq[b]), int(ck[b + 1] - ck[b])
        qs = rq[cq[b]:cq[b + 1]].transpose(0, 1)
        ks = rk[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(2, 0)
        vs = rv[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(2, 0)
        s = qs @ ks.transpose(1, 2) / 4.0
        s = 2.0 * torch.tanh(s / 2.0)
        i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
        s = s - slopes.double()[:, None, None] * (i + nk - nq - j).abs()
        keep = (j <= i + nk - nq) & (j >= i + nk - nq - 4)
        s = s.masked_fill(~keep, float("-inf"))
        full = torch.cat([s, rs[:, None, None].expand(4, nq, 1)], dim=-1)
        w = torch.softmax(full, dim=-1)[..., :nk]
        outs.append((w @ vs).transpose(0, 1))
    want = torch.cat(outs)
    want.backward(grad.double())
    tol = dict(rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(out.detach().double().numpy(), want.detach().numpy(), **tol)
    for got_t, ref_t in ((qt, rq), (kt, rk), (vt, rv), (sinks, rs)):
        assert got_t.grad is not None and got_t.grad.dtype == got_t.dtype
        np.testing.assert_allclose(got_t.grad.double().numpy(), ref_t.grad.numpy(), **tol)


def test_varlen_alibi_grad_refused():
    """alibi_slopes has no gradient in clattn (nor flash-attn): requires_grad on it raises,
    never a silently missing gradient."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    q, k, v, cq, ck = (torch.from_numpy(a) for a in varlen_problem(rng))
    slopes = torch.full((4,), 0.1, requires_grad=True)
    with pytest.raises(clattn.ArgumentError, match="alibi_slopes requires grad"):
        clattn.varlen_attention(q, k, v, cq, ck, alibi_slopes=slopes)
