"""clattn.MultiheadAttention against a float64 numpy reference of nn.MultiheadAttention's
forward (test_torch.py compares with PyTorch itself where torch is installed): packed and
separate (kdim/vdim) projections, no bias, masks (bool and float, (L, S) and (N*H, L, S)),
key padding, causal, averaged and per-head weights, both paths; bad calls raise."""

import math

import numpy as np
import pytest

import clattn


def random_state(rng, e, kdim=None, vdim=None, bias=True):
    """An nn.MultiheadAttention state_dict of random numpy arrays."""
    kdim, vdim = kdim or e, vdim or e

    def u(*shape):
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)

    state = {"out_proj.weight": u(e, e)}
    if kdim == e and vdim == e:
        state["in_proj_weight"] = u(3 * e, e)
    else:
        state.update(q_proj_weight=u(e, e), k_proj_weight=u(e, kdim), v_proj_weight=u(e, vdim))
    if bias:
        state.update({"in_proj_bias": u(3 * e), "out_proj.bias": u(e)})
    return state


def reference(state, heads, q, k, v, key_padding_mask=None, attn_mask=None, is_causal=False):
    """nn.MultiheadAttention's forward in float64 on batch-first (N, L, E) arrays: returns the
    output and the per-head weights (N, H, L, S); fully masked rows give zeros."""
    e = q.shape[-1]

    def f(a):
        return np.asarray(a, np.float64)

    if "in_proj_weight" in state:
        wq, wk, wv = np.split(f(state["in_proj_weight"]), 3)
    else:
        wq, wk, wv = (f(state[n]) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    bq = bk = bv = 0.0
    if "in_proj_bias" in state:
        bq, bk, bv = np.split(f(state["in_proj_bias"]), 3)
    n, l, s, d = q.shape[0], q.shape[1], k.shape[1], e // heads

    def split(x):
        return x.reshape(n, -1, heads, d).transpose(0, 2, 1, 3)

    Q, K, V = split(f(q) @ wq.T + bq), split(f(k) @ wk.T + bk), split(f(v) @ wv.T + bv)
    scores = Q @ K.transpose(0, 1, 3, 2) / math.sqrt(d)
    keep = np.ones(scores.shape, bool)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        m = m.reshape(n, heads, l, s) if m.ndim == 3 else m
        if m.dtype == np.bool_:
            keep &= ~np.broadcast_to(m, scores.shape)
        else:
            scores = scores + m
    if key_padding_mask is not None:
        p = np.asarray(key_padding_mask)
        if p.dtype == np.bool_:
            keep &= ~p[:, None, None, :]
        else:
            scores = scores + p[:, None, None, :]
    if is_causal:
        keep &= np.tril(np.ones((l, s), bool))
    keep &= np.isfinite(scores)
    scores = np.where(keep, scores, -np.inf)
    mx = scores.max(-1, keepdims=True)
    ex = np.where(keep, np.exp(scores - np.where(np.isfinite(mx), mx, 0)), 0)
    tot = ex.sum(-1, keepdims=True)
    w = np.where(tot > 0, ex / np.where(tot > 0, tot, 1), 0)
    o = (w @ V).transpose(0, 2, 1, 3).reshape(n, l, e) @ f(state["out_proj.weight"]).T
    if "out_proj.bias" in state:
        o = o + f(state["out_proj.bias"])
    return o, w


@pytest.mark.parametrize("path", ["fused", "unfused"])
@pytest.mark.parametrize("kw", [{}, {"kdim": 12, "vdim": 20}, {"bias": False}])
def test_against_float64(path, kw):
    rng = np.random.default_rng(7)
    e, h, n, l, s = 16, 4, 2, 9, 13
    state = random_state(rng, e, kw.get("kdim"), kw.get("vdim"), kw.get("bias", True))
    mha = clattn.NumpyMultiheadAttention(e, h, batch_first=True, path=path, **kw)
    mha.load_state_dict(state)
    q = rng.standard_normal((n, l, e)).astype(np.float32)
    k = rng.standard_normal((n, s, kw.get("kdim", e))).astype(np.float32)
    v = rng.standard_normal((n, s, kw.get("vdim", e))).astype(np.float32)
    cases = [{}, {"key_padding_mask": rng.random((n, s)) < 0.3},
             {"attn_mask": rng.random((l, s)) < 0.2},
             {"attn_mask": rng.standard_normal((n * h, l, s)).astype(np.float32)},
             {"is_causal": True}]
    for args in cases:
        want_out, want_w = reference(state, h, q, k, v, **args)
        wants_weights = path == "unfused"
        out, weights = mha(q, k, v, need_weights=wants_weights, average_attn_weights=False,
                           **args)
        np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=2e-6)
        if wants_weights:
            np.testing.assert_allclose(weights, want_w, rtol=1e-5, atol=2e-6)
            out, averaged = mha(q, k, v, **args)
            np.testing.assert_allclose(averaged, want_w.mean(1), rtol=1e-5, atol=2e-6)
        else:
            assert weights is None


@pytest.mark.parametrize("path", ["fused", "unfused"])
def test_positional_order_is_torchs(path):
    # nn.MultiheadAttention's orders: (embed_dim, num_heads, dropout, bias, add_bias_kv,
    # add_zero_attn, kdim, vdim, batch_first) and forward(query, key, value, key_padding_mask,
    # need_weights, attn_mask, average_attn_weights, is_causal); ctx and path keyword-only.
    rng = np.random.default_rng(8)
    e, h, n, l, s, kdim, vdim = 16, 4, 2, 9, 13, 12, 20
    state = random_state(rng, e, kdim, vdim)
    positional = clattn.NumpyMultiheadAttention(e, h, 0.0, True, False, False, kdim, vdim, True,
                                           path=path)
    keyword = clattn.NumpyMultiheadAttention(e, h, kdim=kdim, vdim=vdim, batch_first=True,
                                        path=path)
    for mha in (positional, keyword):
        mha.load_state_dict(state)
    q = rng.standard_normal((n, l, e)).astype(np.float32)
    k = rng.standard_normal((n, s, kdim)).astype(np.float32)
    v = rng.standard_normal((n, s, vdim)).astype(np.float32)
    padding = rng.random((n, s)) < 0.3
    mask = rng.standard_normal((n * h, l, s)).astype(np.float32)
    need = path == "unfused"
    want_out, want_w = reference(state, h, q, k, v, key_padding_mask=padding, attn_mask=mask)
    out, weights = positional(q, k, v, padding, need, mask, False, False)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=2e-6)
    again, again_w = keyword(q, k, v, key_padding_mask=padding, need_weights=need,
                             attn_mask=mask, average_attn_weights=False, is_causal=False)
    np.testing.assert_array_equal(out, again)
    if need:
        np.testing.assert_allclose(weights, want_w, rtol=1e-5, atol=2e-6)
        np.testing.assert_array_equal(weights, again_w)
    else:
        assert weights is None and again_w is None
    # average_attn_weights 7th, is_causal 8th: per-head weights of causal attention
    out, weights = positional(q, k, v, None, need, None, False, True)
    want_out, want_w = reference(state, h, q, k, v, is_causal=True)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=2e-6)
    if need:
        np.testing.assert_allclose(weights, want_w, rtol=1e-5, atol=2e-6)
    with pytest.raises(TypeError):  # a 9th positional argument is not taken for ctx
        clattn.NumpyMultiheadAttention(e, h, 0.0, True, False, False, None, None, True, None)


def test_bad_calls_raise():
    mha = clattn.NumpyMultiheadAttention(8, 2, batch_first=True)
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(clattn.ArgumentError, match="load_state_dict"):
        mha(x, x, x)
    with pytest.raises(clattn.ArgumentError, match="state_dict lacks"):
        mha.load_state_dict({})
    mha.load_state_dict(random_state(np.random.default_rng(0), 8))
    with pytest.raises(clattn.ArgumentError):
        mha(np.zeros((1, 3, 7), np.float32), x, x)
    with pytest.raises(clattn.ArgumentError, match="attn_mask"):
        mha(x, x, x, attn_mask=np.zeros((2, 2), bool))
    with pytest.raises(clattn.ArgumentError):
        clattn.NumpyMultiheadAttention(10, 3)
