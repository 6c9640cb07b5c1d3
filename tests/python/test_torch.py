"""clattn against PyTorch itself (skipped where torch is not installed: the lane's PyPI venv
has no torch, whose Linux wheels on PyPI carry CUDA; tests/python/run.sh runs this file again
in a venv over Debian's python3-torch where that is installed, or use a venv that has torch,
e.g. `CLATTN_PY_VENV=/work/venv-peers tests/python/run.sh build`): scaled_dot_product_attention
and nn.MultiheadAttention with the same state_dict, torch tensors in -> torch tensors out."""

import inspect

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
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        pytest.skip(f"torch {torch.__version__} has no scaled_dot_product_attention (2.0+)")
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
    mha = clattn.NumpyMultiheadAttention(e, h, batch_first=batch_first, path=path, **kw)
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
    takes_is_causal = "is_causal" in inspect.signature(ref.forward).parameters  # torch 2.0+
    for args in cases:
        if "is_causal" in args and not takes_is_causal:
            continue
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
    mha = clattn.NumpyMultiheadAttention(8, 2)
    mha.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    x = torch.randn(5, 8)
    with torch.no_grad():
        want_out, want_w = ref(x, x, x)
    out, weights = mha(x.numpy(), x.numpy(), x.numpy())
    close(out, want_out)
    close(weights, want_w)


def reference64(q, k, v, causal=False):
    """float64 attention on numpy arrays (B, H, L, E) with equal heads."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


DTYPES = {"float32": (torch.float32, 2e-6), "float64": (torch.float64, 2e-6),
          "float16": (torch.float16, 2e-3), "bfloat16": (torch.bfloat16, 2e-2)}


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("path", PATHS)
def test_sdpa_torch_in_torch_out(name, path):
    dtype, tol = DTYPES[name]
    if dtype == torch.bfloat16:
        pytest.importorskip("ml_dtypes")
    g = torch.Generator().manual_seed(3)
    q = torch.rand(2, 3, 17, 8, generator=g).to(dtype) * 2 - 1
    k = torch.rand(2, 3, 23, 8, generator=g).to(dtype) * 2 - 1
    v = torch.rand(2, 3, 23, 8, generator=g).to(dtype) * 2 - 1
    out = clattn.scaled_dot_product_attention(q, k, v, None, 0.0, True, path=path)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == q.device
    assert out.shape == (2, 3, 17, 8)
    want = reference64(*(t.float().numpy() for t in (q, k, v)), causal=True)
    np.testing.assert_allclose(out.float().numpy(), want, rtol=10 * tol, atol=tol)
    # a strided (non-contiguous) tensor is read where it lies, with the same result
    kt = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not kt.is_contiguous()
    again = clattn.scaled_dot_product_attention(q, kt, v, is_causal=True, path=path)
    assert torch.equal(again, out)
    # a torch mask (bool, True = attend, as torch's SDPA) with torch inputs
    mask = torch.rand(17, 23, generator=g) < 0.7
    masked = clattn.scaled_dot_product_attention(q, k, v, mask, path=path)
    assert isinstance(masked, torch.Tensor) and masked.dtype == dtype
    # numpy in still gives numpy out
    out_np = clattn.scaled_dot_product_attention(q.float().numpy(), k.float().numpy(),
                                                 v.float().numpy(), is_causal=True, path=path)
    assert isinstance(out_np, np.ndarray)


def test_torch_conversions_share_memory():
    from clattn import _torch as bridge
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # strided view
    a = bridge.to_numpy(t)
    assert a.shape == (4, 3) and np.shares_memory(a, t.numpy())
    r = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = bridge.from_numpy(r, t)
    assert isinstance(back, torch.Tensor) and np.shares_memory(back.numpy(), r)
    grad = torch.ones(2, 2, requires_grad=True)  # detached, not refused
    assert bridge.to_numpy(grad).shape == (2, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_mha_torch_in_torch_out(dtype):
    torch.manual_seed(4)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    mha = clattn.NumpyMultiheadAttention(16, 4, batch_first=True)
    mha.load_state_dict(ref.state_dict())
    x = torch.randn(2, 9, 16).to(dtype)
    out, weights = mha(x, x, x)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == x.device
    assert isinstance(weights, torch.Tensor) and weights.dtype == dtype
    with torch.no_grad():
        want_out, want_w = ref(x.float(), x.float(), x.float())
    tol = 2e-3 if dtype == torch.float16 else 2e-6
    np.testing.assert_allclose(out.float().numpy(), want_out.numpy(), rtol=1e-3, atol=tol)
    np.testing.assert_allclose(weights.float().numpy(), want_w.numpy(), rtol=1e-3, atol=tol)
    out_np, _ = mha(x.float().numpy(), x.float().numpy(), x.float().numpy(), need_weights=False)
    assert isinstance(out_np, np.ndarray)


def test_numpy_callers_never_import_torch():
    # torch stays optional: numpy calls of every entry point that takes torch tensors leave it
    # unimported (a fresh interpreter, since this one has imported torch).
    import os
    import subprocess
    import sys
    code = """
import sys
import numpy as np
import clattn
x = np.random.default_rng(0).standard_normal((1, 2, 5, 8)).astype(np.float32)
clattn.scaled_dot_product_attention(x, x, x, None, 0.0, True)
mha = clattn.NumpyMultiheadAttention(8, 2, batch_first=True)
rng = np.random.default_rng(1)
mha.load_state_dict({"in_proj_weight": rng.standard_normal((24, 8)).astype(np.float32),
                     "in_proj_bias": np.zeros(24, np.float32),
                     "out_proj.weight": rng.standard_normal((8, 8)).astype(np.float32),
                     "out_proj.bias": np.zeros(8, np.float32)})
mha(x[0], x[0], x[0])
print("torch" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_varlen_attention_torch_and_alibi():
    """torch tensors in, a torch tensor out; ALiBi slopes per (sequence, head) and soft-capping
    per sequence equal the padded per-sequence reference (ALiBi's distance from each
    sequence's own last key)."""
    rng = np.random.default_rng(29)
    cq, ck = np.array([0, 3, 10]), np.array([0, 11, 13], dtype=np.int32)
    q, k, v = rand(rng, 10, 2, 8), rand(rng, 13, 2, 8), rand(rng, 13, 2, 8)
    slopes = rng.uniform(0, 0.5, size=(2, 2)).astype(np.float32)
    got = clattn.varlen_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                  torch.from_numpy(cq), torch.from_numpy(ck), softcap=2.0,
                                  alibi_slopes=slopes)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (10, 2, 8)
    for b in range(2):
        nq, nk = int(cq[b + 1] - cq[b]), int(ck[b + 1] - ck[b])
        i, j = np.arange(nq)[:, None], np.arange(nk)[None, :]
        qs, ks, vs = (np.swapaxes(a[c[b]:c[b + 1]], 0, 1).astype(np.float64)
                      for a, c in ((q, cq), (k, ck), (v, ck)))
        s = qs @ np.swapaxes(ks, -1, -2) / np.sqrt(8.0)
        s = 2.0 * np.tanh(s / 2.0) - slopes[b][:, None, None] * np.abs(i + nk - nq - j)
        w = np.exp(s - s.max(-1, keepdims=True))
        want = (w / w.sum(-1, keepdims=True)) @ vs
        np.testing.assert_allclose(np.swapaxes(got.numpy()[cq[b]:cq[b + 1]], 0, 1), want,
                                   rtol=1e-4, atol=1e-5)
