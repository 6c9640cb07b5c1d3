"""clattn against PyTorch itself (skipped where torch is not installed: the CI lane's venv has
no torch, whose Linux wheels on PyPI carry CUDA; run with a venv that has it, e.g.
`CLATTN_PY_VENV=/work/venv-peers tests/python/run.sh build`): scaled_dot_product_attention
and nn.MultiheadAttention with the same state_dict."""

import numpy as np
import pytest

import clattn

torch = pytest.importorskip("torch")
PATHS = ["fused", "unfused"]


def rand(rng, *shape, dtype=np.float32):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def close(got, want, tol=2e-6):
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=tol)


def test_sdpa_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 2, 8, 65, 64), rand(rng, 2, 8, 127, 64), rand(rng, 2, 8, 127, 64)
    mask = rng.random((65, 127)) < 0.8
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}, {"scale": 0.2}):
        t_kwargs = dict(kwargs)
        if "attn_mask" in t_kwargs:
            t_kwargs["attn_mask"] = torch.from_numpy(mask)
        want = torch.nn.functional.scaled_dot_product_attention(
            torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), **t_kwargs).numpy()
        for path in PATHS:
            got = clattn.scaled_dot_product_attention(q, k, v, path=path, **kwargs)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("path", ["fused", "unfused"])
@pytest.mark.parametrize("kw, batch_first", [({}, True), ({}, False),
                                             ({"kdim": 12, "vdim": 20}, True),
                                             ({"bias": False}, True)])
def test_mha_against_torch(path, kw, batch_first):
    torch.manual_seed(1)
    e, h, n, l, s = 16, 4, 3, 7, 11
    ref = torch.nn.MultiheadAttention(e, h, batch_first=batch_first, **kw).eval()
    mha = clattn.MultiheadAttention(e, h, batch_first=batch_first, path=path, **kw)
    mha.load_state_dict(ref.state_dict())
    kdim, vdim = kw.get("kdim", e), kw.get("vdim", e)

    def inputs(length, width):
        return torch.randn(n, length, width) if batch_first else torch.randn(length, n, width)

    q, k, v = inputs(l, e), inputs(s, kdim), inputs(s, vdim)
    cases = [{}, {"key_padding_mask": torch.rand(n, s) < 0.3},
             {"key_padding_mask": torch.randn(n, s)},
             {"attn_mask": torch.rand(l, s) < 0.2}, {"attn_mask": torch.randn(n * h, l, s)},
             {"average_attn_weights": False}, {"need_weights": False},
             {"attn_mask": torch.ones(l, s, dtype=torch.bool).triu(1), "is_causal": True}]
    for args in cases:
        if path == "fused" and args.get("need_weights", True):
            args = dict(args, need_weights=False)
        with torch.no_grad():
            want_out, want_w = ref(q, k, v, **args)
        out, weights = mha(q, k, v, **args)
        close(out, want_out)
        if want_w is None:
            assert weights is None
        else:
            close(weights, want_w)


def test_mha_unbatched():
    torch.manual_seed(2)
    ref = torch.nn.MultiheadAttention(8, 2).eval()
    mha = clattn.MultiheadAttention(8, 2)
    mha.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    x = torch.randn(5, 8)
    with torch.no_grad():
        want_out, want_w = ref(x, x, x)
    out, weights = mha(x.numpy(), x.numpy(), x.numpy())
    close(out, want_out)
    close(weights, want_w)
