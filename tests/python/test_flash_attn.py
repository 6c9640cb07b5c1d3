"""clattn.flash_attn, imported as flash-attn code imports flash-attn, against a float64
reference written from flash-attn's documentation (flash_attn_interface.py docstrings; the
library itself needs CUDA):

- q (B, Lq, H, D), k and v (B, Lk, Hkv, D); H a multiple of Hkv (MQA/GQA: query head h uses
  k/v head h // (H // Hkv));
- causal: query i sees keys j <= i + Lk - Lq (aligned to the bottom-right corner);
- window_size (left, right): keys j in [i + Lk - Lq - left, i + Lk - Lq + right], -1 for
  unbounded;
- softcap > 0: scores s = softcap * tanh(s / softcap) (after scaling);
- alibi_slopes (H,) or (B, H): -slope * |i + Lk - Lq - j| added to the score;
- softmax_lse (B, H, Lq): logsumexp of each row's scaled, capped, biased, masked scores;
- varlen: each sequence of the packed batch alone; kvcache: the cache's first
  cache_seqlens[b] keys plus the appended k, v (written into the cache in place).

The numpy tests run without torch; the torch ones (autograd, dtypes) skip without it."""

import numpy as np
import pytest

import clattn.flash_attn as flash_attn
from clattn import ArgumentError, dropout_mask
from clattn.flash_attn import (flash_attn_func, flash_attn_qkvpacked_func,
                               flash_attn_varlen_func, flash_attn_with_kvcache)

TOL = dict(rtol=2e-5, atol=5e-6)



def band(Lq, Lk, causal, window):
    """flash-attn's bottom-right band as a bool (Lq, Lk) matrix (True = the key is seen):
    query i sits at key position i + Lk - Lq; causal keeps keys up to it, window (left,
    right) keys within left before and right after it (-1 unbounded)."""
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    diag = i + Lk - Lq
    keep = np.ones((Lq, Lk), bool)
    if causal:
        keep &= j <= diag
    if window[0] >= 0:
        keep &= j >= diag - window[0]
    if window[1] >= 0:
        keep &= j <= diag + window[1]
    return keep

def rand(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None,
              sinks=None, drop=None):
    """float64 (out (B, Lq, H, Dv), lse (B, H, Lq)) from flash-attn's documented semantics;
    rows with no key give zeros (and lse -inf: clattn's convention). drop: the (B, H, Lq, Lk)
    factor of dropped weights (clattn.dropout_mask(..., scaled=True))."""
    q, k, v = (np.asarray(a, np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    group = H // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * (D ** -0.5 if scale is None else scale)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    diag = i + Lk - Lq
    if alibi is not None:
        slopes = np.broadcast_to(np.asarray(alibi, np.float64), (B, H))
        s = s - slopes[:, :, None, None] * np.abs(diag - j)
    keep = band(Lq, Lk, causal, window)
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, np.float64)[None, :, None, None])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(keep, np.exp(s - m), 0.0)
    total = e.sum(-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(np.asarray(sinks, np.float64)[None, :, None, None] - m)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(total > 0, e / total, 0.0)
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + m[..., 0], -np.inf)
    if drop is not None:
        w = w * drop
    return (w @ v).transpose(0, 2, 1, 3), lse


def problem(rng, B, Lq, Lk, H, Hkv, D, Dv=None):
    return rand(rng, B, Lq, H, D), rand(rng, B, Lk, Hkv, D), rand(rng, B, Lk, Hkv, Dv or D)


SIZES = [(1, 1, 1, 1, 1, 8), (2, 3, 17, 4, 2, 16), (1, 17, 3, 3, 3, 16), (1, 63, 65, 2, 1, 32),
         (3, 7, 7, 6, 2, 40), (2, 13, 11, 4, 4, 8)]
OPTIONS = [{}, {"causal": True}, {"window_size": (3, 2)}, {"window_size": (-1, 0)},
           {"causal": True, "window_size": (5, -1)}, {"softcap": 1.5},
           {"alibi_slopes": "h"}, {"alibi_slopes": "bh", "causal": True},
           {"softmax_scale": 0.3, "softcap": 0.7, "window_size": (4, 4)}]


def _options(rng, opts, B, H):
    opts = dict(opts)
    if opts.get("alibi_slopes") == "h":
        opts["alibi_slopes"] = rng.uniform(0, 0.5, H).astype(np.float32)
    elif opts.get("alibi_slopes") == "bh":
        opts["alibi_slopes"] = rng.uniform(0, 0.5, (B, H)).astype(np.float32)
    ref = dict(causal=opts.get("causal", False), window=opts.get("window_size", (-1, -1)),
               softcap=opts.get("softcap", 0.0), alibi=opts.get("alibi_slopes"),
               scale=opts.get("softmax_scale"))
    return opts, ref


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("index", range(len(OPTIONS)))
def test_flash_attn_func(size, index):
    """flash_attn_func on numpy (B, L, H, D) arrays, every documented option, awkward sizes
    (1, 3, 17, 63/65, Lq > Lk, GQA/MQA), out and softmax_lse against the reference."""
    rng = np.random.default_rng(index * 31 + size[1])
    B, Lq, Lk, H, Hkv, D = size
    q, k, v = problem(rng, B, Lq, Lk, H, Hkv, D)
    opts, ref = _options(rng, OPTIONS[index], B, H)
    out = flash_attn_func(q, k, v, **opts)
    want, lse_want = reference(q, k, v, **ref)
    assert out.shape == (B, Lq, H, D) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, **TOL)
    out2, lse, probs = flash_attn_func(q, k, v, **opts, return_attn_probs=True)
    np.testing.assert_array_equal(out2, out)
    assert lse.shape == (B, H, Lq) and lse.dtype == np.float32 and probs is None
    np.testing.assert_allclose(lse, lse_want, **TOL)


def test_documented_positional_calls():
    """flash-attn's positional order: (q, k, v, dropout_p, softmax_scale, causal,
    window_size, softcap, alibi_slopes, deterministic, return_attn_probs); the module-level
    names as flash-attn's (flash_attn.flash_attn_func, ...)."""
    rng = np.random.default_rng(1)
    q, k, v = problem(rng, 2, 5, 9, 4, 2, 16)
    slopes = rng.uniform(0, 0.5, 4).astype(np.float32)
    out = flash_attn.flash_attn_func(q, k, v, 0.0, 0.25, True, (6, -1), 2.0, slopes, True, False)
    want, _ = reference(q, k, v, True, (6, -1), 2.0, slopes, 0.25)
    np.testing.assert_allclose(out, want, **TOL)
    qkv = np.stack([rand(rng, 2, 9, 4, 16) for _ in range(3)], axis=2)  # (B, L, 3, H, D)
    out = flash_attn.flash_attn_qkvpacked_func(qkv, 0.0, None, True)
    want, _ = reference(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    np.testing.assert_allclose(out, want, **TOL)
    kv = np.stack([k, v], axis=2)  # (B, Lk, 2, Hkv, D)
    out = flash_attn.flash_attn_kvpacked_func(q, kv, 0.0, None, True)
    np.testing.assert_allclose(out, reference(q, k, v, causal=True)[0], **TOL)
    with pytest.raises(ArgumentError, match=r"qkv has shape"):
        flash_attn_qkvpacked_func(q)


def test_sinks_and_float64():
    """clattn's extras are keyword-only: sinks (H,) join each row's denominator; float64 in,
    float64 out."""
    rng = np.random.default_rng(2)
    q, k, v = problem(rng, 2, 4, 6, 4, 2, 16)
    sinks = np.array([0.5, -1.0, 2.0, -np.inf], np.float32)
    out = flash_attn_func(q.astype(np.float64), k, v, causal=True, sinks=sinks)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, reference(q, k, v, causal=True, sinks=sinks)[0], **TOL)
    with pytest.raises(TypeError):
        flash_attn_func(q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False, False, sinks)


def test_dropout_numpy():
    """dropout_p > 0 (numpy needs dropout_seed): clattn's Philox mask on (B, H, Lq, Lk)
    weights, scaled by 1 / (1 - p), the lse the undropped row's."""
    rng = np.random.default_rng(3)
    q, k, v = problem(rng, 2, 5, 7, 4, 2, 16)
    out, lse, _ = flash_attn_func(q, k, v, 0.25, causal=True, return_attn_probs=True,
                                  dropout_seed=1234, dropout_offset=8)
    factor = dropout_mask((2, 4, 5, 7), 0.25, 1234, 8, scaled=True)
    want, lse_want = reference(q, k, v, causal=True, drop=factor)
    np.testing.assert_allclose(out, want, **TOL)
    np.testing.assert_allclose(lse, lse_want, **TOL)
    with pytest.raises(ArgumentError, match="dropout_seed"):
        flash_attn_func(q, k, v, 0.25)


def varlen_reference(q, k, v, cq, ck, **ref):
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b in range(len(cq) - 1):
        if cq[b + 1] == cq[b]:
            continue
        sl = {k_: (a[b:b + 1] if k_ == "alibi" and a is not None and np.ndim(a) == 2 else a)
              for k_, a in ref.items()}
        o, s = reference(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]],
                         v[None, ck[b]:ck[b + 1]], **sl)
        out[cq[b]:cq[b + 1]] = o[0]
        lse[:, cq[b]:cq[b + 1]] = s[0]
    return out, lse


@pytest.mark.parametrize("index", range(len(OPTIONS)))
def test_flash_attn_varlen_func(index):
    """Packed sequences (lengths 1, 0, 17, 3 against 5, 3, 17, 63: Lq > Lk, Lq < Lk, an
    empty one), GQA, each option per sequence; return_attn_probs' lse is (H, total_q)."""
    rng = np.random.default_rng(40 + index)
    lq, lk = (1, 0, 17, 3), (5, 3, 17, 63)
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, k, v = rand(rng, cq[-1], 6, 16), rand(rng, ck[-1], 2, 16), rand(rng, ck[-1], 2, 8)
    opts, ref = _options(rng, OPTIONS[index], 4, 6)
    out, lse, probs = flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), **opts,
                                             return_attn_probs=True)
    want, lse_want = varlen_reference(q, k, v, cq, ck, **ref)
    assert out.shape == (cq[-1], 6, 8) and lse.shape == (6, cq[-1]) and probs is None
    np.testing.assert_allclose(out, want, **TOL)
    np.testing.assert_allclose(lse, lse_want, **TOL)
    with pytest.raises(ArgumentError, match="dropout_p=0.1"):
        flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), 0.1)


def test_flash_attn_varlen_func_paged():
    """block_table: k and v are paged caches (num_blocks, page_size, Hkv, D), sequence b's
    keys its first cu_seqlens_k[b + 1] - cu_seqlens_k[b] slots through its table row."""
    rng = np.random.default_rng(5)
    page, lk, lq = 3, (7, 2, 9), (2, 2, 5)
    blocks = 9
    k_cache, v_cache = rand(rng, blocks, page, 2, 16), rand(rng, blocks, page, 2, 16)
    table = np.array([[8, 0, 4], [2, 7, 7], [1, 3, 5]], np.int32)
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q = rand(rng, cq[-1], 4, 16)
    out = flash_attn_varlen_func(q, k_cache, v_cache, cq, ck, 5, 9, causal=True,
                                 block_table=table)
    k = np.concatenate([k_cache[table[b, np.arange(n) // page], np.arange(n) % page]
                        for b, n in enumerate(lk)])
    v = np.concatenate([v_cache[table[b, np.arange(n) // page], np.arange(n) % page]
                        for b, n in enumerate(lk)])
    np.testing.assert_allclose(out, varlen_reference(q, k, v, cq, ck, causal=True)[0], **TOL)


def rotate(x, cos, sin, pos, interleaved):
    """flash-attn's apply_rotary_emb (float64): x (B, L, H, D) at positions pos (B, L)."""
    x = np.asarray(x, np.float64).copy()
    half = cos.shape[1]
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, b * c + a * s
    return x


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("extra", [{}, {"softcap": 3.0}, {"window_size": (4, 0)},
                                   {"rotary": True}, {"rotary": False},
                                   {"cache_leftpad": True}, {"cache_batch_idx": True}])
def test_flash_attn_with_kvcache(paged, extra):
    """Decoding: new k, v appended in place at cache_seqlens (then attended with the cache),
    causal bottom-right; contiguous (B_cache, L_cache, Hkv, D) caches with cache_batch_idx or
    cache_leftpad, paged (num_blocks, page_size, Hkv, D) ones with block_table; rotary
    (interleaved or halves) on q and the new k; softcap/window take the gathered path;
    return_softmax_lse."""
    if paged and ("cache_batch_idx" in extra):
        pytest.skip("cache_batch_idx is not for paged caches (nor in flash-attn)")
    rng = np.random.default_rng(6)
    B, Lq, H, Hkv, D, cap = 2, 3, 4, 2, 16, 12
    seqlens = np.array([5, 0], np.int32)
    q, k_new, v_new = rand(rng, B, Lq, H, D), rand(rng, B, Lq, Hkv, D), rand(rng, B, Lq, Hkv, D)
    kw = {k_: a for k_, a in extra.items() if k_ in ("softcap", "window_size")}
    rows = np.arange(B)
    if extra.get("cache_batch_idx"):
        rows = np.array([2, 0])
        kw["cache_batch_idx"] = rows.astype(np.int32)
    if paged:
        page = 4
        k_cache, v_cache = rand(rng, 7, page, Hkv, D), rand(rng, 7, page, Hkv, D)
        table = np.array([[6, 1, 3], [0, 5, 2]], np.int32)
        kw["block_table"] = table

        def view(cache, b):
            return cache[table[b]].reshape(cap, Hkv, D)
    else:
        k_cache, v_cache = rand(rng, 3, cap, Hkv, D), rand(rng, 3, cap, Hkv, D)

        def view(cache, b):
            return cache[rows[b]]
    starts = np.zeros(B, np.int64)
    if extra.get("cache_leftpad"):
        starts = np.array([2, 0])
        kw["cache_leftpad"] = starts.astype(np.int32)
    q_ref, k_ref = q, k_new
    if "rotary" in extra:
        cos_sin = rng.uniform(0, 6, (16, 4))  # rotary_dim 8 of D 16
        cos, sin = np.cos(cos_sin).astype(np.float32), np.sin(cos_sin).astype(np.float32)
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=extra["rotary"])
        pos = seqlens[:, None] + np.arange(Lq)[None, :]
        q_ref = rotate(q, cos, sin, pos, extra["rotary"])
        k_ref = rotate(k_new, cos, sin, pos, extra["rotary"])
    before_k = [view(k_cache, b).copy() for b in range(B)]
    before_v = [view(v_cache, b).copy() for b in range(B)]
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                       cache_seqlens=seqlens, causal=True,
                                       return_softmax_lse=True, **kw)
    assert out.shape == (B, Lq, H, D) and lse.shape == (B, H, Lq)
    for b in range(B):
        n = int(seqlens[b])
        kb, vb = view(k_cache, b), view(v_cache, b)  # appended in place
        np.testing.assert_allclose(kb[n:n + Lq], k_ref[b], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(vb[n:n + Lq], v_new[b])
        np.testing.assert_array_equal(kb[:n], before_k[b][:n])
        np.testing.assert_array_equal(vb[n + Lq:], before_v[b][n + Lq:])
        s = int(starts[b])
        want, lse_want = reference(q_ref[b:b + 1], kb[None, s:n + Lq], vb[None, s:n + Lq],
                                   causal=True, softcap=extra.get("softcap", 0.0),
                                   window=extra.get("window_size", (-1, -1)))
        np.testing.assert_allclose(out[b:b + 1], want, **TOL)
        np.testing.assert_allclose(lse[b:b + 1], lse_want, **TOL)
    # the fast path (no lse, no window/softcap/ALiBi/leftpad) gives the same numbers
    again = flash_attn_with_kvcache(q_ref.astype(np.float32), k_cache, v_cache,
                                    cache_seqlens=seqlens + Lq, causal=True,
                                    **{k_: a for k_, a in kw.items()
                                       if k_ in ("block_table", "cache_batch_idx",
                                                 "cache_leftpad", "softcap", "window_size")})
    np.testing.assert_allclose(again, out, rtol=1e-5, atol=2e-6)


def test_kvcache_refusals():
    rng = np.random.default_rng(7)
    q, kc, vc = rand(rng, 1, 1, 2, 16), rand(rng, 1, 8, 2, 16), rand(rng, 1, 8, 2, 16)
    cos = np.ones((8, 4), np.float32)
    with pytest.raises(ArgumentError, match="give k and v"):
        flash_attn_with_kvcache(q, kc, vc, rotary_cos=cos, rotary_sin=cos, cache_seqlens=3)
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        flash_attn_with_kvcache(q, kc, vc, q, q, rotary_cos=cos, rotary_sin=cos,
                                cache_seqlens=3, cache_leftpad=np.array([1], np.int32))
    with pytest.raises(ArgumentError, match="fit the cache"):
        flash_attn_with_kvcache(q, kc, vc, q, q, cache_seqlens=8)
    with pytest.raises(ArgumentError, match="kv_dtype"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, softcap=1.0, kv_dtype="q8_0")
    with pytest.raises(ArgumentError, match="multiples of 32"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, kv_dtype="q8_0")


def test_kvcache_kv_dtype():
    """kv_dtype (keyword-only extra): the cache read as llama.cpp's q8_0 blocks, close to the
    float result."""
    rng = np.random.default_rng(8)
    q, kc, vc = rand(rng, 2, 1, 4, 32), rand(rng, 2, 10, 2, 32), rand(rng, 2, 10, 2, 32)
    plain = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([10, 4], np.int32))
    quant = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([10, 4], np.int32),
                                    kv_dtype="q8_0")
    assert 0 < np.abs(quant - plain).max() < 0.05


# --- torch: autograd, dtypes, devices -------------------------------------------------------

def torch_reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                    scale=None, sinks=None):
    """reference() in torch float64, differentiable."""
    import torch
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    k = k.repeat_interleave(H // k.shape[1], 1)
    v = v.repeat_interleave(H // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) * (D ** -0.5 if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(Lq)[:, None], torch.arange(Lk)[None, :]
    diag = i + Lk - Lq
    if alibi is not None:
        slopes = torch.as_tensor(np.asarray(alibi), dtype=torch.float64).expand(B, H)
        s = s - slopes[:, :, None, None] * (diag - j).abs()
    s = s.masked_fill(~torch.from_numpy(band(Lq, Lk, causal, window)), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks[None, :, None, None].expand(B, H, Lq, 1)], dim=-1)
    w = torch.softmax(s, dim=-1)
    w = torch.where(torch.isnan(w), torch.zeros_like(w), w)[..., :Lk]
    return (w @ v).transpose(1, 2)


@pytest.mark.parametrize("size", [(2, 3, 17, 4, 2, 16), (1, 17, 5, 3, 1, 8),
                                  (1, 63, 65, 2, 2, 32)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("index", [0, 1, 2, 5, 7, 8])
def test_flash_attn_func_backward(size, index):
    """flash_attn_func is differentiable (q, k, v): gradients against float64 torch autograd
    of the reference, GQA/MQA, each option."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(100 + index)
    B, Lq, Lk, H, Hkv, D = size
    arrays = problem(rng, B, Lq, Lk, H, Hkv, D)
    opts, ref = _options(rng, OPTIONS[index], B, H)
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays)
    out = flash_attn_func(q, k, v, **opts)
    assert out.requires_grad and out.dtype == torch.float32
    grad = torch.from_numpy(rand(rng, *out.shape))
    out.backward(grad)
    rq, rk, rv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays)
    want = torch_reference(rq, rk, rv, **ref)
    want.backward(grad.double())
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), **TOL)
    for got, exp in ((q, rq), (k, rk), (v, rv)):
        np.testing.assert_allclose(got.grad.numpy(), exp.grad.numpy(), rtol=1e-4, atol=2e-5)


def test_qkvpacked_and_varlen_backward():
    """flash_attn_qkvpacked_func's gradient is qkv's shape; flash_attn_varlen_func's reach
    q, k, v and sinks; lse is returned, not differentiable."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    qkv_np = rand(rng, 2, 7, 3, 4, 16)
    qkv = torch.tensor(qkv_np, requires_grad=True)
    out, lse, _ = flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert not lse.requires_grad and tuple(lse.shape) == (2, 4, 7)
    out.square().sum().backward()
    ref = torch.tensor(qkv_np, dtype=torch.float64, requires_grad=True)
    torch_reference(ref[:, :, 0], ref[:, :, 1], ref[:, :, 2], causal=True).square().sum() \
        .backward()
    np.testing.assert_allclose(qkv.grad.numpy(), ref.grad.numpy(), rtol=1e-4, atol=2e-5)

    cq = torch.tensor([0, 3, 4, 11], dtype=torch.int32)
    ck = torch.tensor([0, 5, 17, 19], dtype=torch.int32)
    arrays = rand(rng, 11, 4, 16), rand(rng, 19, 2, 16), rand(rng, 19, 2, 16)
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays)
    sinks = torch.tensor([0.3, -0.5, 1.0, 0.0], requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cq, ck, 7, 12, 0.0, None, True, (3, -1), 1.5,
                                 sinks=sinks)
    grad = torch.from_numpy(rand(rng, *out.shape))
    out.backward(grad)
    rq, rk, rv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays)
    rs = sinks.detach().double().requires_grad_(True)
    want = torch.cat([torch_reference(rq[None, cq[b]:cq[b + 1]], rk[None, ck[b]:ck[b + 1]],
                                      rv[None, ck[b]:ck[b + 1]], causal=True, window=(3, -1),
                                      softcap=1.5, sinks=rs)[0] for b in range(3)])
    want.backward(grad.double())
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), **TOL)
    for got, exp in ((q, rq), (k, rk), (v, rv), (sinks, rs)):
        np.testing.assert_allclose(got.grad.numpy(), exp.grad.numpy(), rtol=1e-4, atol=2e-5)


def test_torch_dtypes_dropout_and_kvcache_grad():
    """torch in, torch out of q's dtype; dropout draws its seed from torch's generator
    (torch.manual_seed repeats it) and its backward regenerates the mask; the kvcache
    function refuses tensors that require grad (flash-attn's is not differentiable)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    q, k, v = (torch.from_numpy(a) for a in problem(rng, 2, 5, 6, 4, 2, 16))
    for dtype in (torch.float16, torch.float64):
        out = flash_attn_func(q.to(dtype), k.to(dtype), v.to(dtype), causal=True)
        assert out.dtype == dtype and isinstance(out, torch.Tensor)
        want = flash_attn_func(q, k, v, causal=True)
        np.testing.assert_allclose(out.double().numpy(), want.double().numpy(),
                                   atol=3e-3 if dtype == torch.float16 else 1e-6)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    torch.manual_seed(0)
    first = flash_attn_func(qg, kg, vg, 0.3, causal=True)
    torch.manual_seed(0)
    second = flash_attn_func(q, k, v, 0.3, causal=True)
    assert torch.equal(first.detach(), second)
    first.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()
    with pytest.raises(ArgumentError, match="flash_attn_with_kvcache is not differentiable"):
        flash_attn_with_kvcache(qg, k, v, cache_seqlens=3)
    with torch.no_grad():
        out = flash_attn_with_kvcache(qg, k.clone(), v.clone(), k[:, :1], v[:, :1],
                                      cache_seqlens=torch.tensor([2, 5], dtype=torch.int32))
    assert tuple(out.shape) == (2, 5, 4, 16) and out.dtype == torch.float32


def test_kvcache_torch_append_in_place():
    """A torch cache receives the new keys in place (as flash-attn's does), including a paged
    one through block_table."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    kc, vc = torch.zeros(4, 2, 2, 8), torch.zeros(4, 2, 2, 8)
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    k_new, v_new = torch.from_numpy(rand(rng, 2, 1, 2, 8)), torch.from_numpy(rand(rng, 2, 1, 2, 8))
    q = torch.from_numpy(rand(rng, 2, 1, 4, 8))
    out = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=torch.tensor(
        [2, 1], dtype=torch.int32), block_table=table)
    assert torch.equal(kc[1, 0], k_new[0, 0]) and torch.equal(vc[0, 1], v_new[1, 0])
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (2, 1, 4, 8)


def test_kvcache_rotary_not_causal():
    """Neither causal nor windowed: flash-attn rotates every query row at position
    cache_seqlens[b] (the new keys still at cache_seqlens[b] + i)."""
    rng = np.random.default_rng(14)
    q, k_new, v_new = rand(rng, 2, 3, 2, 16), rand(rng, 2, 3, 2, 16), rand(rng, 2, 3, 2, 16)
    kc, vc = rand(rng, 2, 8, 2, 16), rand(rng, 2, 8, 2, 16)
    seqlens = np.array([4, 1], np.int32)
    angles = rng.uniform(0, 6, (8, 8))  # rotary_dim 16: the whole head
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    out = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cos, sin, seqlens,
                                  rotary_interleaved=False)
    for b in range(2):
        n = int(seqlens[b])
        q_rot = rotate(q[b:b + 1], cos, sin, np.full((1, 3), n), False)
        want, _ = reference(q_rot, kc[None, b, :n + 3], vc[None, b, :n + 3])
        np.testing.assert_allclose(out[b:b + 1], want, **TOL)


def test_varlen_paged_backward_reaches_the_cache():
    """flash_attn_varlen_func with block_table gathers the pages differentiably: the gradient
    of a page equals the gradient of the keys it holds."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(15)
    k_cache = torch.tensor(rand(rng, 4, 2, 1, 8), requires_grad=True)
    v_cache = torch.tensor(rand(rng, 4, 2, 1, 8), requires_grad=True)
    table = torch.tensor([[3, 0], [1, 2]], dtype=torch.int32)
    cq, ck = torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([0, 3, 7],
                                                                        dtype=torch.int32)
    q = torch.tensor(rand(rng, 3, 2, 8), requires_grad=True)
    flash_attn_varlen_func(q, k_cache, v_cache, cq, ck, 2, 4, causal=True,
                           block_table=table).sum().backward()
    k = torch.cat([k_cache[3], k_cache[0, :1], k_cache[1], k_cache[2]]).detach()
    v = torch.cat([v_cache[3], v_cache[0, :1], v_cache[1], v_cache[2]]).detach()
    k.requires_grad_(True)
    v.requires_grad_(True)
    flash_attn_varlen_func(q.detach(), k, v, cq, ck, 2, 4, causal=True).sum().backward()
    assert torch.equal(k_cache.grad[3], k.grad[:2]) and torch.equal(k_cache.grad[2], k.grad[5:])
    assert torch.equal(v_cache.grad[0, 0], v.grad[2]) and not v_cache.grad[0, 1].any()
