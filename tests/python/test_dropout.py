"""Attention dropout from Python (clattn_sdpa_desc.dropout_p, _seed, _offset): clattn.dropout_mask
(numpy Philox 4x32-10) against the library's clattn_dropout_keep point by point and against
Random123's known answers; the forward on numpy (and pyopencl) arrays against a float64
reference built from that mask, softmax(S) * factor @ V; and, where torch is installed (the
torch step of run.sh), the autograd path: out and the q, k, v, float mask and sinks gradients
against torch's float64 autograd of the same reference, torch.manual_seed repeatability,
clattn.TorchMultiheadAttention's dropout in train() and eval(), p = 1."""

import numpy as np
import pytest

import clattn
from clattn import dropout as dropout_module
from clattn._lib import lib

try:
    import torch
except ImportError:  # the main venv has no torch: the torch tests skip there
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="no torch")
TOL = 1e-4  # max |clattn - reference| relative to max |reference|


def np_reference(q, k, v, factor, mask=None, causal=False, scale=None):
    """float64 attention with its weights multiplied by `factor` (dropout_mask(scaled=True));
    k and v may have fewer heads (GQA). Every row keeps a key here."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    return (w * factor) @ v


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- the mask --------------------------------------------------------------------------------


def test_philox_known_answers():
    """Random123's kat_vectors for philox4x32_10."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
             ((0xffffffff,) * 4, (0xffffffff,) * 2,
              (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
             ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
              (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, want in cases:
        got = dropout_module.philox4x32_10(counter, key)
        assert tuple(int(w) for w in got) == want


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1e-9, 1.0])
def test_mask_matches_clattn_dropout_keep(p):
    rng = np.random.default_rng(int(p * 1000) + 1)
    shape = (3, 5, 37, 41)
    for seed, offset in ((0, 0), (int(rng.integers(0, 2 ** 63)) * 2 + 1, 17),
                         (0xFFFFFFFF_FFFFFFFF, 2 ** 64 - 7)):  # streams wrap past 2^64
        keep = clattn.dropout_mask(shape, p, seed, offset)
        assert keep.shape == shape and keep.dtype == np.bool_
        heads = shape[1]
        for _ in range(300):
            b, h, i, j = (int(rng.integers(0, n)) for n in shape)
            stream = (offset + b * heads + h) % 2 ** 64
            assert lib.clattn_dropout_keep(p, seed, stream, i, j) == int(keep[b, h, i, j]), \
                (p, seed, offset, b, h, i, j)
        factor = clattn.dropout_mask(shape, p, seed, offset, scaled=True)
        assert factor.dtype == np.float32
        scale = np.float32(1 / (1 - p)) if p < 1 else np.float32(0)
        np.testing.assert_array_equal(factor, np.where(keep, scale, np.float32(0)))
    if 0.01 < p < 1:
        assert abs(keep.mean() - (1 - p)) < 0.02  # about 1 - p kept


def test_mask_shapes_and_arguments():
    keep = clattn.dropout_mask((2, 3, 4, 9), 0.5, 99, 4)
    # leading dims are flattened into streams: (6, 4, 9) with offset 4 is the same draw, and
    # (4, 9) with offset 4 + 1 * 3 + 2 is weight (1, 2)'s stream
    np.testing.assert_array_equal(clattn.dropout_mask((6, 4, 9), 0.5, 99, 4),
                                  keep.reshape(6, 4, 9))
    np.testing.assert_array_equal(clattn.dropout_mask((4, 9), 0.5, 99, 4 + 5), keep[1, 2])
    np.testing.assert_array_equal(clattn.dropout_mask((2, 1, 3, 4, 9), 0.5, 99, 4),
                                  keep.reshape(2, 1, 3, 4, 9))
    assert clattn.dropout_mask((2, 2, 3, 3), 0.0, 1).all()
    assert clattn.dropout_mask((2, 0, 3, 3), 0.5, 1).shape == (2, 0, 3, 3)
    assert not clattn.dropout_mask((2, 2, 5, 7), 1.0, 1, scaled=True).any()
    for bad in (dict(dropout_p=-0.1), dict(dropout_p=1.5), dict(dropout_p=True),
                dict(seed=-1), dict(seed=2 ** 64), dict(seed=1.5), dict(offset=-1),
                dict(shape=(5,))):
        args = dict(shape=(1, 1, 2, 2), dropout_p=0.5, seed=1, offset=0)
        args.update(bad)
        with pytest.raises(clattn.ArgumentError):
            clattn.dropout_mask(**args)


# --- numpy and pyopencl inputs ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["fused", "unfused"])
def test_numpy_forward_with_dropout(path):
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 2, 4, 9, 8), rand(rng, 2, 2, 13, 8), rand(rng, 2, 2, 13, 5)
    mask = rand(rng, 9, 13)
    for p, seed, offset in ((0.1, 5, 0), (0.5, 2 ** 63 + 11, 100)):
        factor = clattn.dropout_mask((2, 4, 9, 13), p, seed, offset, scaled=True)
        for kw, m in ((dict(is_causal=True), None), (dict(attn_mask=mask), mask)):
            out = clattn.scaled_dot_product_attention(
                q, k, v, dropout_p=p, enable_gqa=True, path=path, dropout_seed=seed,
                dropout_offset=offset, **kw)
            want = np_reference(q, k, v, factor, mask=m, causal=kw.get("is_causal", False))
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
            # (the lse comes from the fused kernel only)
            again, lse = clattn.sdpa_forward(q, k, v, enable_gqa=True, dropout_p=p,
                                             dropout_seed=seed, dropout_offset=offset, **kw)
            np.testing.assert_allclose(again, want, rtol=1e-5, atol=2e-6)
            undropped, lse0 = clattn.sdpa_forward(q, k, v, enable_gqa=True, **kw)
            np.testing.assert_allclose(lse, lse0, rtol=1e-6, atol=1e-6)  # lse: undropped
    # a new seed or offset is a new mask; the same ones give the same bits
    a = clattn.scaled_dot_product_attention(q, k, v, None, 0.5, enable_gqa=True,
                                            dropout_seed=1)
    b = clattn.scaled_dot_product_attention(q, k, v, None, 0.5, enable_gqa=True,
                                            dropout_seed=1)
    c = clattn.scaled_dot_product_attention(q, k, v, None, 0.5, enable_gqa=True,
                                            dropout_seed=2)
    d = clattn.scaled_dot_product_attention(q, k, v, None, 0.5, enable_gqa=True,
                                            dropout_seed=1, dropout_offset=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)
    # p = 1 zeroes every weight; p = 0 ignores the seed
    zero = clattn.scaled_dot_product_attention(q, k, v, None, 1.0, enable_gqa=True,
                                               dropout_seed=3)
    assert not zero.any()
    np.testing.assert_array_equal(
        clattn.scaled_dot_product_attention(q, k, v, None, 0.0, enable_gqa=True,
                                            dropout_seed=3),
        clattn.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_numpy_dropout_needs_a_seed():
    rng = np.random.default_rng(4)
    q = rand(rng, 1, 2, 5, 4)
    for call in (lambda: clattn.scaled_dot_product_attention(q, q, q, None, 0.1),
                 lambda: clattn.sdpa_forward(q, q, q, dropout_p=0.1),
                 lambda: clattn.sdpa_backward(q, q, q, q, np.zeros((1, 2, 5), np.float32), q,
                                              dropout_p=0.1)):
        with pytest.raises(clattn.ArgumentError, match="dropout_seed"):
            call()
    for bad in (-1, 2 ** 64, 0.5, "1", True):
        with pytest.raises(clattn.ArgumentError, match="dropout_seed"):
            clattn.scaled_dot_product_attention(q, q, q, None, 0.1, dropout_seed=bad)
    with pytest.raises(clattn.ArgumentError, match="dropout_offset"):
        clattn.scaled_dot_product_attention(q, q, q, None, 0.1, dropout_seed=1,
                                            dropout_offset=-1)


def test_pyopencl_inputs_with_dropout():
    cl = pytest.importorskip("pyopencl")
    cla = pytest.importorskip("pyopencl.array")
    queue = None
    for platform in cl.get_platforms():
        if platform.get_devices():
            queue = cl.CommandQueue(cl.Context(platform.get_devices()[:1]))
            break
    if queue is None:
        pytest.skip("no OpenCL device")
    rng = np.random.default_rng(6)
    q, k, v = rand(rng, 2, 2, 7, 8), rand(rng, 2, 2, 11, 8), rand(rng, 2, 2, 11, 8)
    dq, dk, dv = (cla.to_device(queue, a) for a in (q, k, v))
    for _ in range(2):  # the second call of these layouts too (no cached plan holds a seed)
        out = clattn.scaled_dot_product_attention(dq, dk, dv, None, 0.3, dropout_seed=77,
                                                  dropout_offset=2)
        factor = clattn.dropout_mask((2, 2, 7, 11), 0.3, 77, 2, scaled=True)
        np.testing.assert_allclose(out.get(), np_reference(q, k, v, factor), rtol=1e-5,
                                   atol=2e-6)
    with pytest.raises(clattn.ArgumentError, match="dropout_seed"):
        clattn.scaled_dot_product_attention(dq, dk, dv, None, 0.3)


# --- torch: autograd --------------------------------------------------------------------------


def reference(q, k, v, factor, mask=None, is_causal=False, scale=None, sinks=None):
    """test_backward.py's hand-written attention (torch, differentiable) with the weights
    multiplied by `factor` after the softmax: (softmax(S) * factor) @ V."""
    from test_backward import reference as backward_reference  # torch only: import here
    return backward_reference(q, k, v, mask, is_causal, scale, sinks, factor=factor)


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


CASES = {  # (b, hq, hkv, lq, lk, d, dv), options
    "plain": ((2, 3, 3, 17, 33, 16, 16), dict(p=0.1)),
    "causal": ((2, 3, 3, 17, 17, 16, 8), dict(p=0.5, is_causal=True)),
    "gqa_causal": ((2, 4, 2, 13, 21, 8, 8), dict(p=0.1, is_causal=True)),
    "float_mask": ((1, 2, 2, 9, 14, 8, 8), dict(p=0.5, mask="float")),
    "odd_sinks": ((3, 1, 1, 5, 7, 3, 5), dict(p=0.5, sinks=True, scale=0.4)),
    "bool_mask_gqa": ((2, 6, 3, 7, 10, 4, 4), dict(p=0.1, mask="bool")),
}


@needs_torch
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_against_float64_autograd(case):
    (b, hq, hkv, lq, lk, d, dv), c = CASES[case]
    c = dict(c)
    p = c.pop("p")
    gen = torch.Generator().manual_seed(len(case))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = randn(b, hq, lq, d), randn(b, hkv, lk, d), randn(b, hkv, lk, dv)
    inputs = [q, k, v]
    kind = c.pop("mask", None)
    mask = None
    if kind == "float":
        mask = randn(b, 1, lq, lk)
        inputs.append(mask)
    elif kind == "bool":
        mask = torch.rand(lq, lk, generator=gen) < 0.7
        mask[:, 0] = True
    sinks = randn(hq) if c.pop("sinks", False) else None
    if sinks is not None:
        inputs.append(sinks)
    grad_out = randn(b, hq, lq, dv)
    seed, offset = int(torch.randint(0, 2 ** 62, (1,), generator=gen)), 3 * len(case)
    factor = torch.from_numpy(clattn.dropout_mask((b, hq, lq, lk), p, seed, offset,
                                                  scaled=True)).double()
    ours = [x.float().requires_grad_() for x in inputs]
    ref = [x.clone().requires_grad_() for x in inputs]

    def split(xs):
        m = xs[3] if kind == "float" else mask
        s = xs[-1] if sinks is not None else None
        return xs[0], xs[1], xs[2], m, s

    q1, k1, v1, m1, s1 = split(ours)
    out = clattn.scaled_dot_product_attention(q1, k1, v1, m1, p, enable_gqa=hq != hkv,
                                              sinks=s1, dropout_seed=seed,
                                              dropout_offset=offset, **c)
    out.backward(grad_out.float())
    q2, k2, v2, m2, s2 = split(ref)
    want = reference(q2, k2, v2, factor, m2, sinks=s2, **c)
    want.backward(grad_out)
    assert rel_err(out, want) <= TOL, (case, "out", rel_err(out, want))
    for name, a, r in zip(("q", "k", "v", "mask" if kind == "float" else "sinks", "sinks"),
                          ours, ref):
        assert a.grad is not None and a.grad.shape == a.shape, (case, name)
        assert rel_err(a.grad, r.grad) <= TOL, (case, name, rel_err(a.grad, r.grad))
    # the numpy entry points with the same seed: the same output and gradients
    npa = [None if x is None else x.detach().numpy() for x in split(ours)]
    o, lse = clattn.sdpa_forward(*npa[:4], enable_gqa=hq != hkv, sinks=npa[4], dropout_p=p,
                                 dropout_seed=seed, dropout_offset=offset, **c)
    np.testing.assert_allclose(o, out.detach().numpy(), rtol=1e-6, atol=1e-7)
    grads = clattn.sdpa_backward(*npa[:3], o, lse, grad_out.float().numpy(), npa[3],
                                 enable_gqa=hq != hkv, sinks=npa[4], dropout_p=p,
                                 dropout_seed=seed, dropout_offset=offset, **c)
    for g, a in zip(grads, ours):
        np.testing.assert_allclose(g, a.grad.numpy(), rtol=1e-5, atol=1e-6)


@needs_torch
def test_reference_with_a_fixed_mask_passes_gradcheck():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 4, generator=gen, dtype=torch.float64).requires_grad_()
               for n in (3, 5, 5))
    mask = torch.randn(3, 5, generator=gen, dtype=torch.float64).requires_grad_()
    factor = torch.from_numpy(clattn.dropout_mask((1, 2, 3, 5), 0.5, 21, scaled=True)).double()
    assert 0 < (factor == 0).sum() < factor.numel()  # some dropped, some kept
    assert torch.autograd.gradcheck(lambda *a: reference(*a[:3], factor, a[3]),
                                    (q, k, v, mask))
    assert torch.autograd.gradcheck(lambda *a: reference(*a, factor[..., :3], is_causal=True),
                                    (q, k[..., :3, :], v[..., :3, :]))


def _out_and_grads(q, k, v, **kw):
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = clattn.scaled_dot_product_attention(*xs, **kw)
    out.square().sum().backward()
    return [out.detach()] + [x.grad for x in xs]


@needs_torch
def test_torch_manual_seed_repeats_runs():
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 11, 8, generator=gen) for _ in range(3))
    torch.manual_seed(1234)
    first = _out_and_grads(q, k, v, dropout_p=0.3, is_causal=True)
    torch.manual_seed(1234)
    second = _out_and_grads(q, k, v, dropout_p=0.3, is_causal=True)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    third = _out_and_grads(q, k, v, dropout_p=0.3, is_causal=True)  # the generator moved on
    torch.manual_seed(4321)
    fourth = _out_and_grads(q, k, v, dropout_p=0.3, is_causal=True)
    for other in (third, fourth):
        assert all(not torch.equal(a, b) for a, b in zip(first, other))
    # the seed is one draw from torch's default generator (an explicit generator likewise),
    # and the no-grad path draws it the same way
    torch.manual_seed(1234)
    seed = dropout_module.draw_seed()
    explicit = _out_and_grads(q, k, v, dropout_p=0.3, is_causal=True, dropout_seed=seed)
    for a, b in zip(first, explicit):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with_gen = _out_and_grads(q, k, v, dropout_p=0.3, is_causal=True,
                              generator=torch.Generator().manual_seed(1234))
    for a, b in zip(first, with_gen):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.manual_seed(1234)
    with torch.no_grad():
        plain = clattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    assert plain.grad_fn is None
    torch.testing.assert_close(plain, first[0], rtol=0, atol=0)
    # dropout_p = 0 draws nothing
    torch.manual_seed(1234)
    clattn.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert dropout_module.draw_seed() == seed


@needs_torch
def test_p_one_gives_zeros():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen).requires_grad_() for _ in range(3))
    out = clattn.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    out.backward(torch.randn(out.shape, generator=gen))  # a nonzero dO: the backward drops too
    for t in (out, q.grad, k.grad, v.grad):
        assert not t.any()


# --- torch: the module ------------------------------------------------------------------------


@needs_torch
def test_module_dropout_in_train_and_eval():
    torch.manual_seed(0)
    e, h, n, l = 16, 4, 2, 9
    mha = clattn.TorchMultiheadAttention(e, h, dropout=0.5, batch_first=True)
    plain = clattn.TorchMultiheadAttention(e, h, batch_first=True)
    plain.load_state_dict(mha.state_dict())
    assert mha.dropout == 0.5 and mha.training
    x = torch.randn(n, l, e)
    mha.eval()
    torch.testing.assert_close(mha(x, x, x)[0], plain(x, x, x)[0], rtol=0, atol=0)
    mha.train()
    torch.manual_seed(7)
    out, _ = mha(x, x, x, is_causal=True)
    torch.manual_seed(7)
    again, _ = mha(x, x, x, is_causal=True)
    torch.testing.assert_close(out, again, rtol=0, atol=0)
    assert not torch.allclose(out, plain(x, x, x, is_causal=True)[0])
    # what it computed: the projections, then attention with the drawn seed's mask
    torch.manual_seed(7)
    seed = dropout_module.draw_seed()
    factor = torch.from_numpy(clattn.dropout_mask((n, h, l, l), 0.5, seed, scaled=True))
    with torch.no_grad():
        qp, kp, vp = (t.view(n, l, h, e // h).transpose(1, 2)
                      for t in mha._projections(x, x, x))
        attn = reference(qp.double(), kp.double(), vp.double(), factor.double(),
                         is_causal=True)
        want = mha.out_proj(attn.float().transpose(1, 2).reshape(n, l, e))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    out.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in mha.parameters())
    with pytest.raises(clattn.ArgumentError, match="dropout"):
        clattn.TorchMultiheadAttention(e, h, dropout=1.5)
