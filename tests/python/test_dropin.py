"""clattn as a drop-in for torch users (issue 46): each silent wrong answer, dropped gradient
and wrong signature a new user met, checked against torch itself or a float64 reference.
Each test here failed on the code before the fix (4d954a4) and names what it failed with."""

import inspect
import warnings

import numpy as np
import pytest

import clattn

torch = pytest.importorskip("torch")
nn = torch.nn


def reference(q, k, v, mask=None, causal=False, scale=None, softcap=0.0, window=(-1, -1),
              sinks=None):
    """Attention in float64 torch arithmetic, written out: (out, weights). q (..., H, L, E),
    k and v (..., Hkv, S, E) (grouped heads repeated), mask bool (True = takes part) or
    float (added), top-left causal and window, soft-capping, sinks (H,)."""
    q, k, v = q.double(), k.double(), v.double()
    if k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    L, S = s.shape[-2:]
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window[0] >= 0:
        keep &= j >= i - window[0]
    if window[1] >= 0:
        keep &= j <= i + window[1]
    s = s.masked_fill(~keep, -torch.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -torch.inf) if mask.dtype == torch.bool else s + mask.double()
    cols = [s]
    if sinks is not None:
        cols.append(sinks.double().view(-1, 1, 1).expand(s.shape[:-1] + (1,)))
    full = torch.cat(cols, dim=-1)
    m = full.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(full - m)
    total = e.sum(-1, keepdim=True)
    w = (e / torch.where(total > 0, total, torch.ones_like(total)))[..., :S]
    return w @ v, w


def close(got, want, tol=2e-5):
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


# --- 1. silent wrong results ---------------------------------------------------------------


def test_torch_mha_defaults_are_torchs():
    """Old: TorchMultiheadAttention defaulted to batch_first=True (wrong by 1.18 on (L, N, E))
    and need_weights=True raised NotImplementedError."""
    torch.manual_seed(0)
    e, h, n, l, s = 24, 4, 3, 17, 5
    ref = nn.MultiheadAttention(e, h)
    for cls in (clattn.MultiheadAttention, clattn.TorchMultiheadAttention):
        mha = cls(e, h)
        assert mha.batch_first is False
        mha.load_state_dict(ref.state_dict())
        x, y = torch.randn(l, n, e), torch.randn(s, n, e)
        want, want_w = ref(x, y, y)
        got, got_w = mha(x, y, y)
        close(got, want)
        close(got_w, want_w)
        assert got_w.shape == (n, l, s)
        _, per_head = mha(x, y, y, average_attn_weights=False)
        want_ph = ref(x, y, y, average_attn_weights=False)[1]
        close(per_head, want_ph)
        assert mha(x, y, y, need_weights=False)[1] is None
        unbatched, w1 = mha(x[:, 0], y[:, 0], y[:, 0])
        close(unbatched, ref(x[:, 0], y[:, 0], y[:, 0])[0])
        assert w1.shape == (l, s)


# --- 2. autograd ---------------------------------------------------------------------------


def test_multihead_attention_is_an_nn_module_with_gradients():
    """Old: clattn.MultiheadAttention was a plain class (no .to, .eval, .parameters,
    state_dict) whose torch results had requires_grad=False."""
    torch.manual_seed(1)
    e, h, n, l = 16, 4, 2, 13
    mha = clattn.MultiheadAttention(e, h, batch_first=True)
    ref = nn.MultiheadAttention(e, h, batch_first=True)
    assert isinstance(mha, nn.Module)
    assert set(mha.state_dict()) == set(ref.state_dict())
    ref.load_state_dict(mha.state_dict())  # both ways
    assert len(list(mha.parameters())) == len(list(ref.parameters()))
    assert mha.eval() is mha and not mha.training
    x = torch.randn(n, l, e, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    out, w = mha(x, x, x, is_causal=True)
    causal = torch.ones(l, l, dtype=torch.bool).triu(1)
    want, want_w = ref(xr, xr, xr, attn_mask=causal)
    assert out.requires_grad and w.requires_grad
    close(out, want)
    close(w, want_w)
    (out.square().sum() + (w * torch.arange(l)).sum()).backward()
    (want.square().sum() + (want_w * torch.arange(l)).sum()).backward()
    close(x.grad, xr.grad, 1e-4)
    for (name, p), (_, pr) in zip(mha.named_parameters(), ref.named_parameters()):
        close(p.grad, pr.grad, 1e-4)
    half = mha.to(torch.float64)
    assert half.in_proj_weight.dtype == torch.float64


def test_numpy_mha_refuses_tensors_that_require_grad():
    """Old: returned a detached result."""
    e = 8
    mha = clattn.NumpyMultiheadAttention(e, 2, batch_first=True)
    mha.load_state_dict(nn.MultiheadAttention(e, 2, batch_first=True).state_dict())
    x = torch.randn(1, 3, e, requires_grad=True)
    with pytest.raises(TypeError, match="clattn.MultiheadAttention"):
        mha(x, x, x)
    with torch.no_grad():
        out, _ = mha(x, x, x)
    assert isinstance(out, torch.Tensor)


@pytest.mark.parametrize("lq, lk, hq, hkv, d", [(1, 1, 1, 1, 8), (17, 23, 4, 2, 16),
                                                 (3, 65, 6, 3, 32), (63, 29, 2, 1, 8)])
def test_sdpa_softcap_window_weights_against_float64(lq, lk, hq, hkv, d):
    """New arguments: softcap, window_size, need_weights, on torch tensors with autograd
    (values and gradients of both results against float64 torch autograd)."""
    torch.manual_seed(lq * 7 + lk)
    q = torch.randn(2, hq, lq, d)
    k, v = torch.randn(2, hkv, lk, d), torch.randn(2, hkv, lk, d)
    sinks = torch.randn(hq)
    for kw in ({"softcap": 1.5}, {"window_size": (2, 0), "is_causal": True},
               {"window_size": (3, 4), "softcap": 2.0, "sinks": True},
               {"attn_mask": torch.randn(lq, lk), "softcap": 0.5}):
        kw = dict(kw)
        use_sinks = kw.pop("sinks", False)
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        refs = [t.clone().double().requires_grad_() for t in (q, k, v, sinks)]
        out, w = clattn.scaled_dot_product_attention(
            *leaves[:3], enable_gqa=True, need_weights=True,
            sinks=leaves[3] if use_sinks else None, **kw)
        r_out, r_w = reference(*refs[:3], mask=kw.get("attn_mask"),
                               causal=kw.get("is_causal", False),
                               softcap=kw.get("softcap", 0.0),
                               window=kw.get("window_size", (-1, -1)),
                               sinks=refs[3] if use_sinks else None)
        close(out, r_out)
        close(w, r_w)
        plain = clattn.scaled_dot_product_attention(*leaves[:3], enable_gqa=True,
                                                    sinks=leaves[3] if use_sinks else None,
                                                    **kw)
        close(plain, r_out)
        g = torch.randn(w.shape)
        (out.sin().sum() + (w * g).sum()).backward()
        (r_out.sin().sum() + (r_w * g.double()).sum()).backward()
        for a, b in zip(leaves[:4] if use_sinks else leaves[:3], refs):
            close(a.grad, b.grad, 2e-4)


def test_float64_says_once_that_it_computes_in_float32(monkeypatch):
    """Old: float64 came back float64, computed in float32, with no word."""
    from clattn import _common
    monkeypatch.setattr(_common, "_warned_float64", False)
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = clattn.scaled_dot_product_attention(q, q, q)
        clattn.scaled_dot_product_attention(q.numpy(), q.numpy(), q.numpy())
    said = [w for w in seen if "float32" in str(w.message)]
    assert len(said) == 1 and said[0].category is RuntimeWarning
    assert said[0].filename == __file__  # points at the caller's line
    assert out.dtype == torch.float64
    close(out, reference(q, q, q)[0], 1e-5)


# --- 3. names and signatures ------------------------------------------------------------


def test_dir_lists_the_torch_names():
    """Old: TorchMultiheadAttention and clattn.autograd were missing from dir(clattn)."""
    names = dir(clattn)
    for name in ("MultiheadAttention", "NumpyMultiheadAttention", "TorchMultiheadAttention",
                 "autograd", "ops"):
        assert name in names
        if name != "ops" or hasattr(torch.library, "custom_op"):  # ops: torch >= 2.4
            assert getattr(clattn, name) is not None
    with pytest.raises(AttributeError):
        clattn.no_such_thing


def test_kv_cache_torch():
    """Old: KVCache(dtype=torch.float16) failed, attend returned numpy for a torch query, an
    unsupported q8_0 head size raised DeviceError (ArgumentError in paged_attention)."""
    torch.manual_seed(2)
    b, hkv, h, d = 2, 2, 4, 32
    for dtype in (torch.float16, torch.float32, "float16"):
        cache = clattn.KVCache(b, hkv, 16, d, dtype=dtype)
        keys, values = torch.randn(b, hkv, 7, d), torch.randn(b, hkv, 7, d)
        cache.append(keys, values)
        q = torch.randn(b, h, 2, d).to(torch.float16 if dtype != torch.float32 else
                                        torch.float32)
        out = cache.attend(q)
        assert isinstance(out, torch.Tensor) and out.dtype == q.dtype
        kk = keys.to(q.dtype).float()
        vv = values.to(q.dtype).float()
        mask = torch.ones(2, 7, dtype=torch.bool).tril(5)  # the last 2 rows: bottom-right
        want = reference(q.float(), kk, vv, mask=mask)[0]
        close(out.float(), want, 2e-3)
        with pytest.raises(TypeError, match="not differentiable"):
            cache.attend(q.float().requires_grad_())
    with pytest.raises(clattn.ArgumentError, match="multiples of 32"):
        clattn.KVCache(1, 1, 8, 16, dtype="q8_0")


def test_inference_functions_take_torch():
    """Old: rotary_embedding, positional_encoding and onnx_attention returned numpy for torch
    tensors, and raised torch's own 'Can't call numpy()' on tensors that require grad."""
    torch.manual_seed(3)
    x = torch.randn(2, 3, 5, 32)
    for call in (lambda t: clattn.rotary_embedding(t),
                 lambda t: clattn.onnx_attention(t, t, t)["Y"]):
        got = call(x)
        assert isinstance(got, torch.Tensor) and got.dtype == x.dtype
        np.testing.assert_array_equal(got.numpy(), np.asarray(call(x.numpy())))
        with pytest.raises(TypeError, match="not differentiable"):
            call(x.clone().requires_grad_())
    xs = x[0, 0].clone().requires_grad_()
    pe = clattn.positional_encoding(xs)
    close(pe.detach(), clattn.positional_encoding(x[0, 0]), 1e-6)
    pe.sum().backward()
    close(xs.grad, torch.ones_like(xs))
    table = torch.randn(9, 32, requires_grad=True)
    rows = clattn.positional_encoding(x[0, 0], table=table, start=2)
    rows.sum().backward()
    assert table.grad[2:7].eq(1).all() and table.grad[:2].eq(0).all()


def test_signatures_match_torch():
    """MultiheadAttention's constructor and forward take torch's parameters in torch's order
    with torch's defaults (clattn's extras keyword-only)."""
    for ours, theirs in ((clattn.MultiheadAttention.__init__, nn.MultiheadAttention.__init__),
                         (clattn.MultiheadAttention.forward, nn.MultiheadAttention.forward)):
        mine = [p for p in inspect.signature(ours).parameters.values()
                if p.kind is not p.KEYWORD_ONLY]
        torchs = list(inspect.signature(theirs).parameters.values())
        # (torch before 2.0 has no is_causal: its list is then a prefix of ours)
        assert [p.name for p in mine][:len(torchs)] == [p.name for p in torchs]
        assert [p.default for p in mine][:len(torchs)] == [p.default for p in torchs]
        assert len(mine) == len(torchs) or torch.__version__ < "2"
