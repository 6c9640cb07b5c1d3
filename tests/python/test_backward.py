"""clattn's attention backward from Python: clattn.sdpa_backward (numpy), the torch autograd
Function behind clattn.scaled_dot_product_attention on tensors that require grad, and
clattn.TorchMultiheadAttention trained with a torch optimizer against torch's own
nn.MultiheadAttention holding the same weights.

torch.autograd.gradcheck wants float64 end to end and clattn computes in float32, so clattn is
not gradchecked itself: its gradients are compared with torch's float64 autograd of a
hand-written reference attention (torch 1.13, Debian's, has no
torch.nn.functional.scaled_dot_product_attention), and that reference is gradchecked (central
differences in float64) so that it is a reference worth comparing with. Skipped without
torch."""

import numpy as np
import pytest

import clattn

torch = pytest.importorskip("torch")
nn = torch.nn

TOL = 1e-4  # max |clattn - reference| relative to max |reference| per gradient


def reference(q, k, v, mask=None, is_causal=False, scale=None, sinks=None, factor=None):
    """Attention as torch.nn.functional.scaled_dot_product_attention defines it, by hand,
    differentiable (any dtype; the tests run it in float64). k and v may have fewer heads
    (GQA: query head h uses head h // (Hq // Hkv)). mask: bool (True = takes part) or float
    (added). sinks (Hq,): a logit per head in each row's denominator. factor: dropout's
    factors (1 / (1 - p) or 0, broadcast over the weights), applied after the softmax."""
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        hq, hk = q.shape[-3], k.shape[-3]
        k = k.repeat_interleave(hq // hk, dim=-3)
        v = v.repeat_interleave(hq // hk, dim=-3)
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if is_causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    if sinks is not None:
        sink = sinks.view(-1, 1, 1).expand(s.shape[:-1] + (1,))
        w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        w = torch.softmax(s, dim=-1)
    return (w if factor is None else w * factor) @ v


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def leaves(*xs, dtype=torch.float32):
    return [x.detach().to(dtype).requires_grad_(x.requires_grad) for x in xs]


def run_both(q, k, v, grad_out, mask=None, **kw):
    """clattn's forward and backward (float32) and the float64 reference's; returns the
    pairs (clattn, reference) for out and each leaf's gradient."""
    inputs = [q, k, v] + ([mask] if mask is not None else []) + (
        [kw["sinks"]] if kw.get("sinks") is not None else [])
    ours = leaves(*inputs)
    ref = leaves(*inputs, dtype=torch.float64)
    if mask is not None and mask.dtype == torch.bool:
        ours[3], ref[3] = mask, mask

    def call(fn, xs, go):
        extra = dict(kw)
        i = 3
        m = None
        if mask is not None:
            m, i = xs[3], 4
        if kw.get("sinks") is not None:
            extra["sinks"] = xs[i]
        out = fn(xs[0], xs[1], xs[2], m, **extra)
        out.backward(go)
        return out

    o1 = call(lambda *a, **b: clattn.scaled_dot_product_attention(
        a[0], a[1], a[2], attn_mask=a[3], enable_gqa=a[0].shape[-3] != a[1].shape[-3], **b),
        ours, grad_out)
    o2 = call(lambda *a, **b: reference(a[0], a[1], a[2], a[3], **b), ref, grad_out.double())
    pairs = [("out", o1, o2)]
    for name, a, b in zip(("q", "k", "v", "mask", "sinks"), ours, ref):
        if a.requires_grad:
            assert a.grad is not None, name
            assert a.grad.shape == a.shape and a.grad.dtype == a.dtype, name
            pairs.append((name, a.grad, b.grad))
    return pairs


def randn(gen, *shape, requires_grad=True):
    return torch.randn(*shape, generator=gen).requires_grad_(requires_grad)


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.3),
    "float_mask": dict(mask="float"),
    "float_mask_4d": dict(mask="float4"),
    "bool_mask": dict(mask="bool"),
    "gqa": dict(hq=4, hkv=2),
    "gqa_causal_sinks": dict(hq=4, hkv=2, is_causal=True, sinks=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_against_float64_autograd(case):
    c = dict(CASES[case])
    gen = torch.Generator().manual_seed(len(case))
    b, lq, lk, d = 2, 17, 33, 16
    hq, hkv = c.pop("hq", 3), c.pop("hkv", 3)
    q, k, v = randn(gen, b, hq, lq, d), randn(gen, b, hkv, lk, d), randn(gen, b, hkv, lk, d)
    kind = c.pop("mask", None)
    mask = None
    if kind == "float":
        mask = randn(gen, lq, lk)
    elif kind == "float4":
        mask = randn(gen, b, 1, lq, lk)
    elif kind == "bool":
        mask = torch.rand(b, hq, lq, lk, generator=gen) < 0.7
        mask[..., 0] = True  # no row without keys (torch gives NaN there, clattn zeros)
    if c.pop("sinks", False):
        c["sinks"] = randn(gen, hq)
    grad_out = torch.randn(b, hq, lq, d, generator=gen)
    for name, got, want in run_both(q, k, v, grad_out, mask, **c):
        assert rel_err(got, want) <= TOL, (case, name, rel_err(got, want))


def test_reference_passes_gradcheck():
    """The float64 reference against central differences (torch.autograd.gradcheck), with a
    float mask and sinks, small."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (randn(gen, 1, 2, n, 4).double() for n in (3, 5, 5))
    mask, sinks = randn(gen, 3, 5).double(), randn(gen, 2).double()
    assert torch.autograd.gradcheck(lambda *a: reference(a[0], a[1], a[2], a[3], sinks=a[4]),
                                    (q, k, v, mask, sinks))
    assert torch.autograd.gradcheck(lambda *a: reference(*a, is_causal=True), (q, k[..., :3, :],
                                                                              v[..., :3, :]))


def expect_masked_grads(out, ours, ref, go):
    """out (clattn on ours: q, k, v, attn_mask) and the reference on ref, backward from go
    (given to clattn in float32): each leaf's gradient float32, of its leaf's shape and within
    TOL of the reference's."""
    out.backward(go.float())
    reference(*ref[:3], ref[3]).backward(go)
    for a, b in zip(ours, ref):
        assert a.grad.dtype == torch.float32 and a.grad.shape == b.shape
        assert rel_err(a.grad, b.grad) <= TOL


def test_against_float32_autograd():
    gen = torch.Generator().manual_seed(11)
    q, k, v = randn(gen, 2, 3, 9, 8), randn(gen, 2, 3, 12, 8), randn(gen, 2, 3, 12, 8)
    mask = randn(gen, 3, 9, 12)
    go = torch.randn(2, 3, 9, 8, generator=gen)
    ours, ref = leaves(q, k, v, mask), leaves(q, k, v, mask)
    out = clattn.scaled_dot_product_attention(*ours[:3], attn_mask=ours[3])
    expect_masked_grads(out, ours, ref, go)


def test_rank3_and_only_some_inputs_require_grad():
    gen = torch.Generator().manual_seed(5)
    q, k, v = randn(gen, 2, 7, 8), randn(gen, 2, 10, 8, requires_grad=False), randn(gen, 2, 10, 4)
    out = clattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.grad_fn is not None and out.shape == (2, 7, 4)
    out.square().sum().backward()
    q64, v64 = (x.detach().double().requires_grad_() for x in (q, v))
    reference(q64, k.double(), v64, is_causal=True).square().sum().backward()
    assert k.grad is None
    assert rel_err(q.grad, q64.grad) <= TOL and rel_err(v.grad, v64.grad) <= TOL


@pytest.mark.parametrize("shapes", [
    ((2, 3, 2, 5, 8), (1, 3, 2, 7, 8), (2, 1, 2, 7, 4), (2, 3, 1, 5, 7)),  # rank 5, broadcast
    ((2, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 4), (2, 1, 1, 7)),  # a stride-0 batch of k and v
    ((5, 8), (7, 8), (7, 4), (7,)),  # rank 2, a rank-1 mask
])
def test_broadcast_batches_and_ranks(shapes):
    """Inputs broadcast along the batch get their gradients summed back to their shapes."""
    gen = torch.Generator().manual_seed(len(shapes[0]))
    ref = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]
    ours = leaves(*ref)
    out = clattn.scaled_dot_product_attention(*ours[:3], attn_mask=ours[3])
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    expect_masked_grads(out, ours, ref, go)


def test_no_grad_path_unchanged():
    gen = torch.Generator().manual_seed(2)
    q, k, v = randn(gen, 1, 2, 5, 8), randn(gen, 1, 2, 6, 8), randn(gen, 1, 2, 6, 8)
    with torch.no_grad():
        out = clattn.scaled_dot_product_attention(q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    plain = clattn.scaled_dot_product_attention(q.detach(), k.detach(), v.detach())
    assert plain.grad_fn is None
    torch.testing.assert_close(out, plain)
    with_grad = clattn.scaled_dot_product_attention(q, k, v)
    assert with_grad.grad_fn is not None
    torch.testing.assert_close(with_grad.detach(), plain, rtol=1e-6, atol=1e-6)


def test_numpy_sdpa_backward():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 4, 6, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 9, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 9, 5)).astype(np.float32)
    mask = rng.standard_normal((6, 9)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    go = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    out, lse = clattn.sdpa_forward(q, k, v, mask, enable_gqa=True, sinks=sinks)
    assert out.shape == (2, 4, 6, 5) and lse.shape == (2, 4, 6) and lse.dtype == np.float32
    np.testing.assert_allclose(out, clattn.scaled_dot_product_attention(
        q, k, v, mask, enable_gqa=True, sinks=sinks), rtol=1e-5, atol=1e-6)
    grads = clattn.sdpa_backward(q, k, v, out, lse, go, mask, enable_gqa=True, sinks=sinks,
                                 want_mask_grad=True)
    dq, dk, dv = grads
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert grads.grad_attn_mask.shape == mask.shape and grads.grad_sinks.shape == (4,)
    ts = [torch.from_numpy(a).double().requires_grad_() for a in (q, k, v, mask, sinks)]
    want = reference(ts[0], ts[1], ts[2], ts[3], sinks=ts[4])
    want.backward(torch.from_numpy(go).double())
    for got, t in zip((dq, dk, dv, grads.grad_attn_mask, grads.grad_sinks), ts):
        assert rel_err(torch.from_numpy(got), t.grad) <= TOL
    # float64 in, float64 gradients out; no mask gradient unless asked
    g64 = clattn.sdpa_backward(q.astype(np.float64), k, v, out, lse, go, mask,
                               enable_gqa=True, sinks=sinks)
    assert g64[0].dtype == np.float64 and g64.grad_attn_mask is None
    with pytest.raises(clattn.ArgumentError):
        clattn.sdpa_backward(q, k, v, out, lse, go, mask > 0, enable_gqa=True, sinks=sinks,
                             want_mask_grad=True)
    with pytest.raises(clattn.ArgumentError):
        clattn.sdpa_backward(q, k, v, out, lse[..., 1:], go, mask, enable_gqa=True)


@pytest.mark.parametrize("causal,gqa,mask", [(False, False, True), (True, True, False),
                                             (False, True, True)])
def test_numpy_sdpa_backward_unfused(causal, gqa, mask):
    """The unfused reference backward (no lse) against float64 autograd and the fused path."""
    rng = np.random.default_rng(5)
    hk = 2 if gqa else 4
    q = rng.standard_normal((2, 4, 7, 16)).astype(np.float32)
    k = rng.standard_normal((2, hk, 11, 16)).astype(np.float32)
    v = rng.standard_normal((2, hk, 11, 8)).astype(np.float32)
    m = rng.standard_normal((7, 11)).astype(np.float32) if mask else None
    go = rng.standard_normal((2, 4, 7, 8)).astype(np.float32)
    out, lse = clattn.sdpa_forward(q, k, v, m, is_causal=causal, enable_gqa=gqa)
    unfused = clattn.sdpa_backward(q, k, v, out, None, go, m, is_causal=causal,
                                   enable_gqa=gqa, want_mask_grad=mask, path="unfused")
    fused = clattn.sdpa_backward(q, k, v, out, lse, go, m, is_causal=causal, enable_gqa=gqa,
                                 want_mask_grad=mask, path="fused")
    ts = [torch.from_numpy(a).double().requires_grad_() for a in (q, k, v)]
    tm = torch.from_numpy(m).double().requires_grad_() if mask else None
    want = reference(ts[0], ts[1], ts[2], tm, is_causal=causal)
    want.backward(torch.from_numpy(go).double())
    for i, t in enumerate(ts):
        assert rel_err(torch.from_numpy(unfused[i]), t.grad) <= TOL
        np.testing.assert_allclose(unfused[i], fused[i], rtol=1e-4, atol=1e-5)
    if mask:
        assert rel_err(torch.from_numpy(unfused.grad_attn_mask), tm.grad) <= TOL
    with pytest.raises(clattn.ArgumentError):
        clattn.sdpa_backward(q, k, v, out, None, go, m, is_causal=causal, enable_gqa=gqa,
                             path="sideways")


def test_autograd_unfused_path():
    """path="unfused" on tensors that require grad: both passes unfused (no lse)."""
    gen = torch.Generator().manual_seed(12)
    q, k, v = randn(gen, 2, 3, 9, 16), randn(gen, 2, 3, 13, 16), randn(gen, 2, 3, 13, 8)
    mask = randn(gen, 9, 13)
    out = clattn.scaled_dot_product_attention(q, k, v, mask, path="unfused")
    go = torch.randn(out.shape, generator=gen)
    out.backward(go)
    ts = [t.detach().double().requires_grad_() for t in (q, k, v, mask)]
    want = reference(*ts)
    want.backward(go.double())
    for got, t in zip((q, k, v, mask), ts):
        assert rel_err(got.grad, t.grad) <= TOL


def test_half_inputs():
    gen = torch.Generator().manual_seed(8)
    q, k, v = (randn(gen, 1, 2, n, 16).half().detach().requires_grad_() for n in (9, 13, 13))
    out = clattn.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.float16
    go = torch.randn(out.shape, generator=gen).half()
    out.backward(go)
    r = [x.detach().double().requires_grad_() for x in (q, k, v)]
    reference(*r).backward(go.double())
    for a, b in zip((q, k, v), r):
        assert a.grad.dtype == torch.float16
        assert rel_err(a.grad, b.grad) <= 5e-3


# --- the module ----------------------------------------------------------------------------


def test_module_matches_torch_mha():
    torch.manual_seed(0)
    e, h, n, l, s = 16, 4, 3, 7, 11
    for batch_first in (True, False):
        ref = nn.MultiheadAttention(e, h, batch_first=batch_first)
        mha = clattn.TorchMultiheadAttention(e, h, batch_first=batch_first)
        mha.load_state_dict(ref.state_dict())
        shape = (n, l, e) if batch_first else (l, n, e)
        kv_shape = (n, s, e) if batch_first else (s, n, e)
        x, y = torch.randn(shape), torch.randn(kv_shape)
        pad = torch.rand(n, s) < 0.3
        pad[:, 0] = False
        causal = torch.ones(l, s, dtype=torch.bool).triu(1)
        for kw in ({}, {"key_padding_mask": pad}, {"attn_mask": causal},
                   {"attn_mask": torch.randn(n * h, l, s), "key_padding_mask": pad}):
            want, want_weights = ref(x, y, y, **kw)  # torch's defaults: averaged weights
            got, weights = mha(x, y, y, **kw)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(weights, want_weights, rtol=1e-4, atol=1e-6)
            _, per_head = mha(x, y, y, average_attn_weights=False, **kw)
            assert per_head.shape == (n, h, l, s)
            torch.testing.assert_close(per_head.mean(1), want_weights, rtol=1e-4, atol=1e-6)
            got, none = mha(x, y, y, need_weights=False, **kw)
            assert none is None
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class _Model(nn.Module):
    """Two attention layers (self-attention plus a residual), then a linear head."""

    def __init__(self, make_attention, embed=16, heads=4, outputs=4):
        super().__init__()
        self.layers = nn.ModuleList([make_attention(embed, heads) for _ in range(2)])
        self.head = nn.Linear(embed, outputs)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x, x, x, need_weights=False)[0]
        return self.head(x)


def _train(model, x, target, steps=20, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_training_matches_torch():
    torch.manual_seed(0)
    ours = _Model(lambda e, h: clattn.TorchMultiheadAttention(e, h, batch_first=True))
    theirs = _Model(lambda e, h: nn.MultiheadAttention(e, h, batch_first=True))
    theirs.load_state_dict(ours.state_dict())
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 10, 16, generator=gen)
    target = torch.randn(4, 10, 4, generator=gen)
    a, b = _train(ours, x, target), _train(theirs, x, target)
    assert len(a) == 20 and all(np.isfinite(a)) and all(np.isfinite(b))
    np.testing.assert_allclose(a, b, rtol=1e-3)
    assert a[-1] < a[0]
    for p, r in zip(ours.parameters(), theirs.parameters()):  # the weights moved alike too
        torch.testing.assert_close(p, r, rtol=1e-3, atol=1e-4)
