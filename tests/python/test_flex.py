"""clattn.flex_attention and clattn.create_block_mask: FlexAttention's documented examples
(causal, sliding window, prefix LM, document masking, ALiBi, soft-capping, relative position
bias, soft-cap with a sliding window) written as FlexAttention users write them, at awkward
sizes (L = 1, 17, 63/65, 127/129, L != S, B = 2, H = 3, grouped heads).

Three references, each in float64 (clattn computes in float32 from the same values):
- numpy (runs everywhere): the functions evaluated on Python scalars (np.vectorize);
- torch's own flex_attention in eager mode (torch with torch.nn.attention.flex_attention,
  e.g. PyPI's 2.15), forward and backward through autograd; skipped where torch lacks it;
- torch without flex_attention (Debian's 1.13 too): the same functions on broadcast index
  tensors, softmax and autograd in torch.

    python3 -m pytest tests/python/test_flex.py
    /work/venv-torch/bin/python -m pytest tests/python/test_flex.py
"""

import math
import warnings

import numpy as np
import pytest

import clattn
from clattn.flex_translate import TranslateError

try:
    import torch
except Exception:  # no torch
    torch = None
try:
    from torch.nn.attention import flex_attention as torch_flex
except Exception:  # no torch, or a torch without flex_attention (Debian's 1.13)
    torch_flex = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")
needs_flex = pytest.mark.skipif(torch_flex is None,
                                reason="needs torch with torch.nn.attention.flex_attention")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

RTOL = 1e-4

# (B, Hq, Hkv, L, S, E, Ev, BLOCK_SIZE)
SIZES = [
    (1, 1, 1, 1, 1, 8, 8, 128),
    (2, 3, 3, 17, 17, 16, 16, 4),
    (1, 2, 2, 63, 65, 32, 16, 16),
    (2, 3, 3, 65, 63, 8, 8, (8, 16)),
    (1, 4, 2, 127, 129, 16, 16, 32),
    (1, 2, 1, 129, 127, 64, 32, 128),
    (2, 6, 3, 1, 33, 16, 16, 8),
]
SIZE_IDS = ["L1", "L17-B2-H3", "L63-S65", "L65-S63-B2", "L127-S129-gqa", "L129-S127-gqa",
            "L1-S33-gqa"]
EXAMPLES = ["causal", "sliding_window", "prefix_lm", "document", "alibi", "softcap",
            "relative", "softcap_window"]


def example(name, B, Hq, L, S, kind):
    """(score_mod, mask_mod) of FlexAttention's example `name`, written for kind 'numpy'
    (captured numpy arrays, math.tanh), 'torch' (captured tensors, torch.tanh, explicit
    combinations) or 'flex' (as 'torch', combined with torch's and_masks)."""
    if kind == "numpy":
        def cap(a, dtype):
            return np.asarray(a, dtype=dtype)
        tanh = math.tanh
        i32, f32 = np.int32, np.float32
    else:
        def cap(a, dtype):
            return torch.tensor(np.asarray(a), dtype=dtype)
        tanh = torch.tanh
        i32, f32 = torch.int32, torch.float32

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    window = 8

    def sliding_window(b, h, q_idx, kv_idx):
        return q_idx - kv_idx <= window

    if name == "causal":
        return None, causal
    if name == "sliding_window":
        def sliding_window_causal(b, h, q_idx, kv_idx):
            causal_mask = q_idx >= kv_idx
            window_mask = q_idx - kv_idx <= window
            return causal_mask & window_mask
        return None, sliding_window_causal
    if name == "prefix_lm":
        prefix_length = cap([min(5, S), max(1, S // 3)][:B], i32)

        def prefix_mask(b, h, q_idx, kv_idx):
            return kv_idx <= prefix_length[b]
        if kind == "flex":
            return None, torch_flex.or_masks(prefix_mask, causal)

        def prefix_lm_causal(b, h, q_idx, kv_idx):
            return prefix_mask(b, h, q_idx, kv_idx) | causal(b, h, q_idx, kv_idx)
        return None, prefix_lm_causal
    if name == "document":
        n = max(L, S)
        document_id = cap(np.repeat(np.arange(n), 7)[:n] // 2, i32)  # documents of 14 tokens

        def document_causal(b, h, q_idx, kv_idx):
            causal_mask = q_idx >= kv_idx
            document_mask = document_id[q_idx] == document_id[kv_idx]
            return causal_mask & document_mask
        return None, document_causal
    if name == "alibi":
        alibi_bias = cap([2.0 ** (-8.0 * (i + 1) / Hq) for i in range(Hq)], f32)

        def alibi(score, b, h, q_idx, kv_idx):
            bias = alibi_bias[h] * (kv_idx - q_idx)
            return score + bias
        return alibi, None
    if name == "softcap":
        softcap = 2.0

        def tanh_softcap(score, b, h, q_idx, kv_idx):
            score = score / softcap
            score = tanh(score)
            score = score * softcap
            return score
        return tanh_softcap, None
    if name == "relative":
        def relative_positional(score, b, h, q_idx, kv_idx):
            return score + (q_idx - kv_idx)
        return relative_positional, None
    if name == "softcap_window":
        softcap = 1.5

        def tanh_softcap(score, b, h, q_idx, kv_idx):
            return softcap * tanh(score / softcap)
        if kind == "flex":
            return tanh_softcap, torch_flex.and_masks(causal, sliding_window)

        def causal_window(b, h, q_idx, kv_idx):
            return causal(b, h, q_idx, kv_idx) & sliding_window(b, h, q_idx, kv_idx)
        return tanh_softcap, causal_window
    raise KeyError(name)


def inputs(B, Hq, Hkv, L, S, E, Ev, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, L, E))
    k = rng.standard_normal((B, Hkv, S, E))
    v = rng.standard_normal((B, Hkv, S, Ev))
    return q, k, v


# --------------------------------------------------------------------------- references

def numpy_reference(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """(out, lse) in float64, the functions evaluated on Python scalars."""
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    k = np.repeat(k.astype(np.float64), Hq // Hkv, axis=1)
    v = np.repeat(v.astype(np.float64), Hq // Hkv, axis=1)
    s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k) * (
        1 / math.sqrt(E) if scale is None else scale)
    b, h, i, j = np.meshgrid(np.arange(B), np.arange(Hq), np.arange(L), np.arange(S),
                             indexing="ij")
    if score_mod is not None:
        s = np.vectorize(lambda x, b, h, i, j: float(score_mod(float(x), int(b), int(h),
                                                               int(i), int(j))))(s, b, h, i, j)
    if mask_mod is not None:
        keep = np.vectorize(lambda b, h, i, j: bool(mask_mod(int(b), int(h), int(i),
                                                             int(j))))(b, h, i, j)
        s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    out = (p @ v) / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.log(total[..., 0]) + m[..., 0]
    return out, lse


def torch_reference(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """(out, lse) in torch's float64 arithmetic, differentiable in q, k, v: the functions on
    broadcast index tensors (what torch's eager flex_attention does through vmap)."""
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(E) if scale is None else scale)
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(Hq).view(1, Hq, 1, 1)
    i = torch.arange(L).view(1, 1, L, 1)
    j = torch.arange(S).view(1, 1, 1, S)
    if score_mod is not None:
        s = score_mod(s, b, h, i, j).expand(B, Hq, L, S)
    if mask_mod is not None:
        keep = torch.as_tensor(mask_mod(b, h, i, j)).expand(B, Hq, L, S)
        s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    out = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))
    return out, torch.log(total[..., 0]) + m[..., 0]


def close(got, want, what, rtol=RTOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)), f"{what}: the infinities differ"
    scale = max(float(np.abs(want[finite]).max()) if finite.any() else 1.0, 1e-3)
    err = float(np.abs(got[finite] - want[finite]).max()) if finite.any() else 0.0
    assert err <= rtol * scale, f"{what}: max error {err:.3g} against a scale of {scale:.3g}"
    assert np.array_equal(got[~finite], want[~finite]), f"{what}: the infinities differ"


def block_mask_for(mask_mod, B, Hq, L, S, block_size):
    return None if mask_mod is None else clattn.create_block_mask(mask_mod, B, Hq, L, S,
                                                                  BLOCK_SIZE=block_size)


# --------------------------------------------------------------------------- numpy

@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_numpy_examples(name, size):
    B, Hq, Hkv, L, S, E, Ev, bs = size
    q, k, v = inputs(B, Hq, Hkv, L, S, E, Ev)
    score_mod, mask_mod = example(name, B, Hq, L, S, "numpy")
    bm = block_mask_for(mask_mod, B, Hq, L, S, bs)
    out, lse = clattn.flex_attention(q.astype(np.float32), k.astype(np.float32),
                                     v.astype(np.float32), score_mod=score_mod, block_mask=bm,
                                     enable_gqa=Hq != Hkv, return_lse=True)
    assert out.dtype == np.float32 and out.shape == (B, Hq, L, Ev)
    assert lse.dtype == np.float32 and lse.shape == (B, Hq, L)
    ref_out, ref_lse = numpy_reference(q, k, v, score_mod, mask_mod)
    close(out, ref_out, "out")
    close(lse, ref_lse, "lse")


def test_numpy_float64_scale_and_c_source():
    B, Hq, L, S, E = 2, 3, 17, 19, 8
    q, k, v = inputs(B, Hq, Hq, L, S, E, E, seed=1)
    bias = np.linspace(-1, 1, Hq * 4).reshape(Hq, 4).astype(np.float32)
    src = ("float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n"
           "{ return score + bias[h * 4 + (q_idx + kv_idx) % 4]; }\n"
           "float score_mod_grad(float score, int b, int h, int q_idx, int kv_idx)\n"
           "{ return 1.0f; }\n")
    out = clattn.flex_attention(q, k, v, score_mod=src, scale=0.3, aux={"bias": bias})
    assert out.dtype == np.float64 and out.shape == (B, Hq, L, E)

    def py(score, b, h, q_idx, kv_idx):
        return score + float(bias[h, (q_idx + kv_idx) % 4])
    close(out, numpy_reference(q, k, v, py, None, scale=0.3)[0], "out")
    # the mask_mod as C source too, its tensor in aux
    keep = (np.arange(S) % 3 != 1).astype(np.uint8)
    mask_src = "int mask_mod(int b, int h, int q_idx, int kv_idx) { return keep[kv_idx]; }\n"
    bm = clattn.create_block_mask(mask_src, None, None, L, S, BLOCK_SIZE=4, aux={"keep": keep})
    out = clattn.flex_attention(q, k, v, block_mask=bm)
    close(out, numpy_reference(q, k, v, None, lambda b, h, i, j: keep[j] != 0)[0], "out")


def test_create_block_mask_matches_brute_force():
    doc = np.repeat(np.arange(20), 5)[:97]

    def mask(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx) | (kv_idx == h + b)
    B, H, L, S = 2, 3, 97, 90
    for bs in (16, (8, 32), 128, 1):
        bm = clattn.create_block_mask(mask, B, H, L, S, BLOCK_SIZE=bs)
        bq, bk = (bs, bs) if isinstance(bs, int) else bs
        b, h, i, j = np.meshgrid(np.arange(B), np.arange(H), np.arange(L), np.arange(S),
                                 indexing="ij")
        dense = (doc[i] == doc[j]) & (i >= j) | (j == h + b)
        nq, nk = -(-L // bq), -(-S // bk)
        want = np.zeros((B, H, nq, nk), np.uint8)
        for x in range(nq):
            for y in range(nk):
                blk = dense[:, :, x * bq:(x + 1) * bq, y * bk:(y + 1) * bk]
                want[:, :, x, y] = np.where(blk.all((2, 3)), 2, np.where(blk.any((2, 3)), 1, 0))
        got = bm.to_dense()
        assert got.dtype == np.uint8 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert bm.shape == (B, H, L, S) and bm.BLOCK_SIZE == (bq, bk)
        assert f"sparsity={100 * np.mean(want == 0):.2f}%" in repr(bm)
    broadcast = clattn.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None,
                                         None, 40, 40, BLOCK_SIZE=16)
    assert broadcast.to_dense().shape == (1, 1, 3, 3)
    np.testing.assert_array_equal(broadcast.to_dense()[0, 0], [[1, 0, 0], [2, 1, 0], [2, 2, 1]])


def test_block_mask_skips_tiles_same_numbers():
    B, H, L, E = 1, 2, 300, 16
    q, k, v = (a.astype(np.float32) for a in inputs(B, H, H, L, L, E, E, seed=2))

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 32)
    sparse = clattn.create_block_mask(window, None, None, L, L, BLOCK_SIZE=32)
    assert sparse.sparsity() > 50
    # the same mask_mod with every block partial: nothing skipped, mask_mod everywhere
    dense = clattn.BlockMask(window, None, np.ones_like(sparse.blocks), sparse.BLOCK_SIZE,
                             sparse.seq_lengths)
    out_sparse = clattn.flex_attention(q, k, v, block_mask=sparse,
                                       kernel_options={"count_tiles": True})
    tiles_sparse = clattn.last_tiles_visited()
    out_dense = clattn.flex_attention(q, k, v, block_mask=dense,
                                      kernel_options={"count_tiles": True})
    tiles_dense = clattn.last_tiles_visited()
    np.testing.assert_array_equal(out_sparse, out_dense)
    assert tiles_sparse.tiles < tiles_dense.tiles
    assert tiles_dense.tile_rows > 0 and tiles_dense.tile_keys > 0
    close(out_sparse, numpy_reference(q, k, v, None, window)[0], "out")


def test_refusals():
    q, k, v = (a.astype(np.float32) for a in inputs(1, 4, 2, 8, 8, 8, 8))
    with pytest.raises(clattn.ArgumentError, match="enable_gqa=True"):
        clattn.flex_attention(q, k, v)
    with pytest.raises(ValueError, match="must divide"):
        clattn.flex_attention(q, k[:, :1].repeat(3, axis=1), v[:, :1].repeat(3, axis=1),
                              enable_gqa=True)
    with pytest.raises(clattn.ArgumentError, match="4-D"):
        clattn.flex_attention(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="dtype"):
        clattn.flex_attention(q.astype(np.int32), k, v, enable_gqa=True)
    with pytest.raises(clattn.ArgumentError, match="kernel_options"):
        clattn.flex_attention(q, k, v, enable_gqa=True, kernel_options={"count_tile": True})
    bm = clattn.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 9, 8)
    with pytest.raises(clattn.ArgumentError, match="block_mask has shape"):
        clattn.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)

    def unsupported(score, b, h, q_idx, kv_idx):
        for _ in range(2):
            score = score + 1
        return score
    with pytest.raises(TranslateError, match="subset"):
        clattn.flex_attention(q, k, v, score_mod=unsupported, enable_gqa=True)
    with pytest.raises(TranslateError):
        clattn.create_block_mask(lambda b, h, q_idx, kv_idx: print(q_idx), None, None, 8, 8)
    t0, t1, t2, t3, t4 = (np.arange(8, dtype=np.int32) + i for i in range(5))
    with pytest.raises(clattn.ArgumentError, match="at most 4"):
        clattn.flex_attention(q, k, v, enable_gqa=True, score_mod=lambda s, b, h, i, j:
                              s + t0[i] + t1[i] + t2[i] + t3[i] + t4[i])


def test_build_error_names_the_line():
    q, k, v = (a.astype(np.float32) for a in inputs(1, 1, 1, 4, 4, 8, 8))
    src = ("float score_mod(float score, int b, int h, int q_idx, int kv_idx)\n"
           "{\n"
           "    return score + undefined_thing;\n"
           "}\n")
    with pytest.raises(clattn.DeviceError, match=r"score_mod:3") as e:
        clattn.flex_attention(q, k, v, score_mod=src)
    assert e.value.status == -2053  # CLATTN_ERR_BUILD


# --------------------------------------------------------------------------- torch

def _torch_case(name, size, kind):
    B, Hq, Hkv, L, S, E, Ev, bs = size
    q, k, v = inputs(B, Hq, Hkv, L, S, E, Ev)
    gout = np.random.default_rng(7).standard_normal((B, Hq, L, Ev))
    score_mod, mask_mod = example(name, B, Hq, L, S, kind)
    return (B, Hq, Hkv, L, S, bs), (q, k, v, gout), score_mod, mask_mod


def _clattn_run(tensors, score_mod, mask_mod, dims, block_mask=None):
    """clattn from float64 tensors that require grad: (out, lse, dq, dk, dv)."""
    B, Hq, Hkv, L, S, bs = dims
    q, k, v, gout = (torch.tensor(a, dtype=torch.float64) for a in tensors)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    bm = block_mask if block_mask is not None else block_mask_for(mask_mod, B, Hq, L, S, bs)
    out, lse = clattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                     enable_gqa=Hq != Hkv, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    assert lse.dtype == torch.float64 and lse.shape == (B, Hq, L)
    (out * gout).sum().backward()
    return [t.detach().numpy() for t in (out, lse, q.grad, k.grad, v.grad)]


@needs_flex
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_torch_flex_examples(name, size, monkeypatch):
    """Forward and backward against torch's flex_attention (eager, float64). torch's wrapper
    refuses a backward on CPU tensors by a device check (its eager backward is the dense math,
    CUDA or not): the check is lifted for the reference."""
    if hasattr(torch_flex, "_validate_device"):
        monkeypatch.setattr(torch_flex, "_validate_device", lambda *args: None)
    # torch's eager flex_attention with grad traces through dynamo; its recompilations make
    # a captured Python float a SymFloat, which torch then refuses: each case starts afresh
    torch._dynamo.reset()
    dims, tensors, score_mod, mask_mod = _torch_case(name, size, "flex")
    B, Hq, Hkv, L, S, bs = dims
    got = _clattn_run(tensors, score_mod, mask_mod, dims)
    q, k, v, gout = (torch.tensor(a, dtype=torch.float64) for a in tensors)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tbm = None if mask_mod is None else torch_flex.create_block_mask(
            mask_mod, B, Hq, L, S, device="cpu")
        out, lse = torch_flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=tbm,
                                             enable_gqa=Hq != Hkv, return_lse=True)
        (out * gout).sum().backward()
    want = [t.detach().numpy() for t in (out, lse, q.grad, k.grad, v.grad)]
    for what, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        close(g, np.nan_to_num(w, nan=0.0) if what != "lse" else w, what)


@needs_torch
@pytest.mark.parametrize("size", [SIZES[1], SIZES[2], SIZES[4], SIZES[6]],
                         ids=[SIZE_IDS[1], SIZE_IDS[2], SIZE_IDS[4], SIZE_IDS[6]])
@pytest.mark.parametrize("name", EXAMPLES)
def test_torch_autograd_examples(name, size):
    """Forward and backward against torch's arithmetic on broadcast indices (any torch)."""
    dims, tensors, score_mod, mask_mod = _torch_case(name, size, "torch")
    got = _clattn_run(tensors, score_mod, mask_mod, dims)
    q, k, v, gout = (torch.tensor(a, dtype=torch.float64) for a in tensors)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out, lse = torch_reference(q, k, v, score_mod, mask_mod)
    (out * gout).sum().backward()
    want = [t.detach().numpy() for t in (out, lse, q.grad, k.grad, v.grad)]
    for what, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        close(g, w, what)


@needs_torch
def test_torch_io_and_refusals():
    q, k, v = (torch.tensor(a, dtype=torch.float32) for a in inputs(1, 2, 2, 9, 9, 8, 8))
    out = clattn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * 0.5)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert out.shape == (1, 2, 9, 8)
    bias = torch.randn(9, requires_grad=True)

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[kv_idx]
    with pytest.raises(clattn.ArgumentError, match="'bias' requires grad"):
        clattn.flex_attention(q, k, v, score_mod=biased)
    with torch.no_grad():  # not recording: a constant
        close(clattn.flex_attention(q, k, v, score_mod=biased).numpy(),
              numpy_reference(q.numpy(), k.numpy(), v.numpy(),
                              lambda s, b, h, i, j: s + float(bias[j]))[0], "out")
    with pytest.raises(clattn.ArgumentError, match=r"aux\['w'\] requires grad"):
        clattn.flex_attention(q, k, v, score_mod="float score_mod(float s, int b, int h, "
                              "int i, int j) { return s + w[j]; }", aux={"w": bias})


@needs_flex
def test_torch_block_mask_is_rebuilt():
    L = 70

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tbm = torch_flex.create_block_mask(causal, None, None, L, L, device="cpu",
                                           BLOCK_SIZE=16)
    q, k, v = (torch.tensor(a, dtype=torch.float32) for a in inputs(1, 2, 2, L, L, 8, 8))
    out = clattn.flex_attention(q, k, v, block_mask=tbm)
    ours = clattn.create_block_mask(causal, None, None, L, L, BLOCK_SIZE=16)
    np.testing.assert_array_equal(out.numpy(),
                                  clattn.flex_attention(q, k, v, block_mask=ours).numpy())
    np.testing.assert_array_equal(ours.to_dense() > 0, tbm.to_dense().numpy() > 0)
