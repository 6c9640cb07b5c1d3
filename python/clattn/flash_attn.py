"""flash-attn's own interface on clattn: code written for flash-attn runs by changing its
import::

    import clattn.flash_attn as flash_attn          # was: import flash_attn
    from clattn.flash_attn import flash_attn_func   # was: from flash_attn import ...
    out = flash_attn_func(q, k, v, causal=True)      # q (B, L, H, D), as flash-attn's

The names, positional order, layouts ((B, L, H, D) tensors; packed (total, H, D) with
cu_seqlens; paged caches (num_blocks, page_size, Hkv, D) with block_table), defaults, return
values and autograd are flash-attn 2's (flash_attn_interface.py): causal masks and sliding
windows are bottom-right aligned when Lq != Lk, ALiBi adds -slope * |i + Lk - Lq - j|,
softcap caps the scaled scores, Hkv dividing H is GQA/MQA. torch tensors (any device; the
computation runs on the clattn device) or numpy arrays in, the same kind out, in q's dtype.
flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func and the varlen
functions are differentiable (clattn's backward); flash_attn_with_kvcache is not (as in
flash-attn) and raises on tensors that require grad rather than return a detached result.

Where clattn differs:
- ``return_attn_probs=True`` gives ``(out, softmax_lse, None)``: the lse (float32; (B, H, Lq)
  or for varlen (H, total_q)) as flash-attn's, but no S_dmask (flash-attn's is a testing aid
  whose layout is internal to its kernels).
- dropout_p > 0 works in flash_attn_func/qkvpacked/kvpacked (clattn's Philox mask: seed from
  torch's generator, or ``dropout_seed=`` keyword; the backward regenerates it) but not in
  the varlen functions (the C library has no dropout on packed batches: ArgumentError).
- a query row that sees no key gives zeros and an lse of -inf (log 0; flash-attn writes
  +inf there).
- ``deterministic`` is accepted and has no effect: clattn's backward is always deterministic.
- ``num_splits`` is accepted and ignored (a scheduling hint).
- flash_attn_with_kvcache: ``rotary_cos``/``rotary_sin`` with ``cache_leftpad`` raise
  NotImplementedError; ``cache_seqlens=None`` means the whole cache (then ``k``/``v`` have no
  place to go and are refused).

clattn's extras, keyword-only everywhere: ``sinks`` ((H,) attention-sink logits, GPT-OSS),
``ctx`` (a clattn.Context), and for the dropout functions ``dropout_seed``,
``dropout_offset``, ``generator``; flash_attn_with_kvcache also takes ``kv_dtype``
("q8_0"/"q4_0": the cache quantized as llama.cpp's blocks as it is read)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import numpy as np

from . import _common, _flash, _lib, _serving, _torch, _varlen
from ._core import ArgumentError, Context
from .dropout import _dropout_args

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]


def _batched(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
             return_attn_probs, sinks, ctx, dropout_seed, dropout_offset, generator, entry):
    """(B, L, H, D) attention: out (B, Lq, H, Dv) and, with return_attn_probs, lse (B, H, Lq)."""
    like = _torch.any_tensor(q, k, v)
    drop = _dropout_args(dropout_p, dropout_seed, dropout_offset, torch_inputs=like is not None,
                         generator=generator, entry=entry)
    if like is not None and _common._needs_grad(q, k, v, sinks, alibi_slopes):
        from ._flash_autograd import flash_autograd
        out, lse = flash_autograd(q, k, v, None, None, None, None, causal, softmax_scale,
                                  window_size, softcap, alibi_slopes, sinks, drop, ctx, entry)
        return (out, lse, None) if return_attn_probs else out
    pb = _flash._flash_problem(
        _torch.to_numpy(q), _torch.to_numpy(k), _torch.to_numpy(v), None, None, None, None,
        causal, softmax_scale, window_size, softcap, _torch.to_numpy(alibi_slopes),
        _torch.to_numpy(sinks), drop, ctx, entry)
    out, lse = _flash._flash_forward(pb, return_attn_probs)
    if like is not None:
        out = _torch.from_numpy(out, like, like.dtype)
        lse = _torch.from_numpy(lse, like)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                    alibi_slopes=None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, sinks=None,
                    ctx: Optional[Context] = None, dropout_seed: Optional[int] = None,
                    dropout_offset: int = 0, generator=None):
    """flash-attn's ``flash_attn_func``: q (B, Lq, H, D), k (B, Lk, Hkv, D), v (B, Lk, Hkv,
    Dv), Hkv dividing H (MQA/GQA). causal: query i sees keys j <= i + Lk - Lq (bottom-right).
    window_size (left, right): keys i + Lk - Lq - left .. i + Lk - Lq + right (-1:
    unbounded). softcap > 0: scores s become softcap * tanh(s / softcap). alibi_slopes (H,)
    or (B, H) float32: bias -slope * |i + Lk - Lq - j|. softmax_scale: None for 1/sqrt(D).
    dropout_p: as flash-attn's (training only: pass 0 in evaluation); the mask is clattn's
    Philox (dropout_seed/dropout_offset/generator keyword-only; a torch call draws the seed
    from torch's generator). Returns out (B, Lq, H, Dv) in q's dtype, or with
    return_attn_probs ``(out, softmax_lse (B, H, Lq) float32, None)``. Differentiable in q, k,
    v and sinks."""
    return _batched(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, return_attn_probs, sinks, ctx, dropout_seed, dropout_offset,
                    generator, "flash_attn_func")


def flash_attn_qkvpacked_func(qkv, dropout_p: float = 0.0,
                              softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                              deterministic: bool = False, return_attn_probs: bool = False, *,
                              sinks=None, ctx: Optional[Context] = None,
                              dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                              generator=None):
    """flash-attn's ``flash_attn_qkvpacked_func``: qkv (B, L, 3, H, D); as
    :func:`flash_attn_func` on qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2] (the gradient is
    qkv's shape)."""
    _check_packed("qkv", qkv, 5, 2, 3)
    return _batched(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
                    window_size, softcap, alibi_slopes, return_attn_probs, sinks, ctx,
                    dropout_seed, dropout_offset, generator, "flash_attn_qkvpacked_func")


def flash_attn_kvpacked_func(q, kv, dropout_p: float = 0.0,
                             softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                             deterministic: bool = False, return_attn_probs: bool = False, *,
                             sinks=None, ctx: Optional[Context] = None,
                             dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                             generator=None):
    """flash-attn's ``flash_attn_kvpacked_func``: q (B, Lq, H, D), kv (B, Lk, 2, Hkv, D)."""
    _check_packed("kv", kv, 5, 2, 2)
    return _batched(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size,
                    softcap, alibi_slopes, return_attn_probs, sinks, ctx, dropout_seed,
                    dropout_offset, generator, "flash_attn_kvpacked_func")


def _check_packed(name, x, rank, dim, count):
    shape = tuple(x.shape)
    if len(shape) != rank or shape[dim] != count:
        want = {("qkv", 5): "(B, L, 3, H, D)", ("kv", 5): "(B, Lk, 2, Hkv, D)",
                ("qkv", 4): "(total, 3, H, D)", ("kv", 4): "(total_k, 2, Hkv, D)"}[(name, rank)]
        raise ArgumentError(_lib.ERR_INVALID_SHAPE, f"{name} has shape {shape}; expected {want}")


def _gather_rows(x, rows):
    """x[rows] for a numpy array or a torch tensor (differentiable), rows int64 numpy."""
    if _torch.is_tensor(x):
        import torch
        return x[torch.as_tensor(rows, device=x.device)]
    return np.asarray(x)[rows]


def _paged_rows(name, cache, block_table, lengths, starts=None):
    """The flat row indices (into cache viewed as (num_blocks * page_size, ...)) of each
    sequence's keys starts[b] .. lengths[b] - 1 in page order, concatenated."""
    table = np.asarray(_torch.to_numpy(block_table))
    pages, page_size = cache.shape[0], cache.shape[1]
    if not np.issubdtype(table.dtype, np.integer) or table.ndim != 2 or \
            table.shape[0] != len(lengths):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"block_table has shape {table.shape} and dtype {table.dtype}; "
                            f"expected integers (B, max_blocks) = ({len(lengths)}, ...)")
    rows = []
    for b, n in enumerate(lengths):
        n = int(n)
        if n > table.shape[1] * page_size:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"sequence {b} has {n} keys but block_table holds "
                                f"{table.shape[1]} blocks of {page_size}")
        j = np.arange(0 if starts is None else int(starts[b]), n)
        page = table[b, j // page_size]
        bad = np.nonzero((page < 0) | (page >= pages))[0]
        if bad.size:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"block_table[{b}, {int(j[bad[0]]) // page_size}] = "
                                f"{int(page[bad[0]])} is not a page of {name} (0 .. "
                                f"{pages - 1})")
        rows.append(page.astype(np.int64) * page_size + j % page_size)
    return np.concatenate(rows) if rows else np.zeros(0, np.int64)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                           alibi_slopes=None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table=None, *, sinks=None,
                           ctx: Optional[Context] = None):
    """flash-attn's ``flash_attn_varlen_func``: q (total_q, H, D), k and v (total_k, Hkv, D)
    packed, cu_seqlens_q/_k (B + 1,) int32 offsets, max_seqlen_q/_k; the options as
    :func:`flash_attn_func`'s, per sequence. block_table (B, max_blocks): k and v are then
    paged caches (num_blocks, page_size, Hkv, D) and sequence b's keys are its first
    cu_seqlens_k[b + 1] - cu_seqlens_k[b] slots through its row of the table (gathered into a
    packed batch first: differentiable, but a copy). dropout_p must be 0 (ArgumentError).
    Returns out (total_q, H, Dv), or with return_attn_probs ``(out, softmax_lse (H, total_q)
    float32, None)``. Differentiable in q, k, v and sinks. With block_table and nothing that
    needs the gather (no gradient recorded, no ALiBi, no window, dropout_p 0) it runs as one
    fused launch over the pages (clattn.paged_varlen_attention: the mixed batch of decodes and
    prefill chunks), the keys read where they lie."""
    if block_table is not None and dropout_p == 0 and alibi_slopes is None and \
            tuple(window_size) == (-1, -1) and not _common._needs_grad(q, k, v, sinks):
        ck = np.asarray(_torch.to_numpy(cu_seqlens_k)).astype(np.int64)
        if ck.ndim != 1 or ck.size < 2 or np.any(np.diff(ck) < 0):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"cu_seqlens_k has shape {ck.shape}: with block_table its (B + 1) "
                                f"offsets give each sequence's key count (non-decreasing)")
        got = _serving.paged_varlen_attention(q, k, v, cu_seqlens_q, block_table,
                                              np.diff(ck).astype(np.int32), causal=causal,
                                              softmax_scale=softmax_scale, softcap=softcap,
                                              sinks=sinks, return_lse=return_attn_probs, ctx=ctx)
        return (got[0], got[1], None) if return_attn_probs else got
    if block_table is not None:
        for name, x in (("k", k), ("v", v)):
            if len(tuple(x.shape)) != 4:
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"{name} has shape {tuple(x.shape)}; with block_table it "
                                    f"is a paged cache (num_blocks, page_size, Hkv, D)")
        ck = np.asarray(_torch.to_numpy(cu_seqlens_k)).astype(np.int64)
        rows = _paged_rows("k", k, block_table, np.diff(ck))
        k = _gather_rows(k.reshape((-1,) + tuple(k.shape[2:])), rows)
        v = _gather_rows(v.reshape((-1,) + tuple(v.shape[2:])), rows)
    _flash._varlen_dropout(dropout_p, "flash_attn_varlen_func")
    return _varlen.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, 0.0, softmax_scale, causal, window_size,
                                    softcap, alibi_slopes, deterministic, return_attn_probs,
                                    sinks=sinks, ctx=ctx)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None,
                                     causal: bool = False, window_size=(-1, -1),
                                     softcap: float = 0.0, alibi_slopes=None,
                                     deterministic: bool = False,
                                     return_attn_probs: bool = False, *, sinks=None,
                                     ctx: Optional[Context] = None):
    """flash-attn's ``flash_attn_varlen_qkvpacked_func``: qkv (total, 3, H, D)."""
    _check_packed("qkv", qkv, 4, 1, 3)
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks, ctx=ctx)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size=(-1, -1), softcap: float = 0.0,
                                    alibi_slopes=None, deterministic: bool = False,
                                    return_attn_probs: bool = False, *, sinks=None,
                                    ctx: Optional[Context] = None):
    """flash-attn's ``flash_attn_varlen_kvpacked_func``: q (total_q, H, D), kv (total_k, 2,
    Hkv, D)."""
    _check_packed("kv", kv, 4, 1, 2)
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks, ctx=ctx)


# --- flash_attn_with_kvcache ------------------------------------------------------------------

def _rotate(x, cos, sin, positions, interleaved: bool):
    """flash-attn's rotary embedding of x (B, L, H, D) (float numpy) at positions (B, L): the
    first 2 * cos.shape[1] columns, pairs (2j, 2j + 1) when interleaved, else halves."""
    half = cos.shape[1]
    c = cos[positions][:, :, None, :]  # (B, L, 1, half)
    s = sin[positions][:, :, None, :]
    y = x.astype(np.float32, copy=True)
    if interleaved:
        x1, x2 = y[..., 0:2 * half:2].copy(), y[..., 1:2 * half:2].copy()
        y[..., 0:2 * half:2] = x1 * c - x2 * s
        y[..., 1:2 * half:2] = x2 * c + x1 * s
    else:
        x1, x2 = y[..., :half].copy(), y[..., half:2 * half].copy()
        y[..., :half] = x1 * c - x2 * s
        y[..., half:2 * half] = x2 * c + x1 * s
    return y


def _like(a, model):
    """The numpy array a as model's kind (a torch tensor of model's dtype and device, or numpy
    of model's dtype)."""
    if _torch.is_tensor(model):
        return _torch.from_numpy(np.ascontiguousarray(a), model, model.dtype)
    return np.asarray(a).astype(np.asarray(model).dtype, copy=False)


def _index(idx, model):
    if _torch.is_tensor(model):
        import torch
        return torch.as_tensor(idx, dtype=torch.long, device=model.device)
    return idx


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size=(-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes=None,
                            num_splits: int = 0, return_softmax_lse: bool = False, *,
                            sinks=None, kv_dtype: Optional[str] = None,
                            ctx: Optional[Context] = None):
    """flash-attn's ``flash_attn_with_kvcache`` (inference: not differentiable).

    q (B, Lq, H, D). k_cache, v_cache (B_cache, L_cache, Hkv, D), or paged (num_blocks,
    page_size, Hkv, D) with block_table (B, max_blocks) int32. cache_seqlens: an int or (B,)
    int32, the keys already in each sequence's cache (None: the whole cache). k, v (B, Lnew,
    Hkv, D) (optional, together): written into the caches IN PLACE at positions
    cache_seqlens[b] .. + Lnew - 1 (after rotary, if given), then attended with the cache; the
    caller advances cache_seqlens itself, as with flash-attn. rotary_cos, rotary_sin
    (seqlen_ro, rotary_dim / 2) (with k and v only): k is rotated at positions
    cache_seqlens[b] + i, q at cache_seqlens[b] + i when causal or windowed, else at
    cache_seqlens[b]; rotary_interleaved: pairs (2j, 2j + 1) (GPT-J) when True, halves
    (GPT-NeoX) when False; the first rotary_dim columns only. cache_batch_idx (B,): the cache
    rows the batch uses (not with block_table). cache_leftpad (B,): sequence b's keys start at
    cache position cache_leftpad[b] (not with rotary). causal, window_size, softcap,
    alibi_slopes, softmax_scale: as :func:`flash_attn_func`'s, bottom-right (the queries are
    each sequence's last rows). num_splits: ignored. Returns out (B, Lq, H, Dv) in q's dtype,
    or with return_softmax_lse ``(out, softmax_lse (B, H, Lq) float32)``.
    Keyword-only extras: sinks (H,), kv_dtype ("q8_0"/"q4_0": the cache read as llama.cpp's
    blocks, float caches quantized on the way; not with window_size, softcap, alibi_slopes,
    cache_leftpad or return_softmax_lse), ctx."""
    like = _torch.any_tensor(q, k_cache, v_cache, k, v)
    if like is not None:
        _refuse_grad(q, k_cache, v_cache, k, v, sinks, alibi_slopes)
    _check_together(k, v, rotary_cos, rotary_sin, cache_leftpad, block_table, cache_batch_idx)
    qn = np.asarray(_torch.to_numpy(q))
    if qn.ndim != 4:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"q has shape {qn.shape}; expected (B, Lq, H, D)")
    geo = _cache_geometry(qn.shape[0], k_cache, v_cache, k, block_table, cache_batch_idx,
                          cache_seqlens, cache_leftpad)
    if rotary_cos is not None:
        qn, k_new, v_new = _rotary(qn, k, v, rotary_cos, rotary_sin, geo, causal, window_size,
                                   rotary_interleaved)
    elif k is not None:
        k_new, v_new = np.asarray(_torch.to_numpy(k)), np.asarray(_torch.to_numpy(v))
    if k is not None:  # append in place, as flash-attn does
        _append(k_cache, v_cache, k_new, v_new, geo)
    kc, vc = np.asarray(_torch.to_numpy(k_cache)), np.asarray(_torch.to_numpy(v_cache))
    left, right = _flash._window(window_size)
    fast = (left, right) == (-1, -1) and not float(softcap) and alibi_slopes is None and \
        cache_leftpad is None and not return_softmax_lse
    if kv_dtype is not None and not fast:
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"kv_dtype={kv_dtype!r} is not supported with window_size, softcap, "
                            f"alibi_slopes, cache_leftpad or return_softmax_lse")
    if fast:  # the fused paged kernel reads the cache where it lies
        # (B_cache, L_cache, ...) unpaged = pages of L_cache slots
        tab = geo.table if geo.paged else geo.rows[:, None]
        out = _serving.paged_attention(
            np.swapaxes(qn, 1, 2), kc, vc, tab, geo.ends, is_causal=causal,
            scale=softmax_scale, sinks=_torch.to_numpy(sinks), kv_dtype=kv_dtype, ctx=ctx)
        out = np.ascontiguousarray(np.swapaxes(out, 1, 2))
        lse = None
    else:  # each sequence's keys gathered into a packed batch
        out, lse = _attend_gathered(qn, kc, vc, geo, causal, softmax_scale, window_size,
                                    softcap, alibi_slopes, sinks, ctx, return_softmax_lse)
    if like is not None:
        out = _torch.from_numpy(out, q if _torch.is_tensor(q) else like,
                                q.dtype if _torch.is_tensor(q) else None)
        lse = _torch.from_numpy(lse, like)
    return (out, lse) if return_softmax_lse else out


def _refuse_grad(q, k_cache, v_cache, k, v, sinks, alibi_slopes) -> None:
    """flash_attn_with_kvcache has no backward: tensors that require grad (while torch
    records gradients) are refused, naming them."""
    if _common._needs_grad(q, k_cache, v_cache, k, v, sinks, alibi_slopes):
        names = [n for n, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k),
                                ("v", v), ("sinks", sinks), ("alibi_slopes", alibi_slopes))
                 if getattr(x, "requires_grad", False)]
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"flash_attn_with_kvcache is not differentiable (as in flash-attn): "
                            f"{', '.join(names)} require{'s' if len(names) == 1 else ''} grad; "
                            f"call it under torch.no_grad() or on detached tensors, or use "
                            f"flash_attn_func / flash_attn_varlen_func for training")


def _check_together(k, v, rotary_cos, rotary_sin, cache_leftpad, block_table,
                    cache_batch_idx) -> None:
    """The arguments that go together (k and v, the rotary pair with k and v) or exclude
    each other (rotary and cache_leftpad, block_table and cache_batch_idx)."""
    if (k is None) != (v is None):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, "k and v are given together, or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "rotary_cos and rotary_sin are given together, or neither")
    if rotary_cos is not None and k is None:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "rotary_cos/rotary_sin apply to new k and v only (as in flash-attn): "
                            "give k and v, or rotate q and the cache yourself")
    if rotary_cos is not None and cache_leftpad is not None:
        raise NotImplementedError("clattn.flash_attn.flash_attn_with_kvcache: rotary_cos/"
                                  "rotary_sin together with cache_leftpad are not implemented "
                                  "(rotate q and k yourself, e.g. clattn.rotary_embedding)")
    if block_table is not None and cache_batch_idx is not None:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "cache_batch_idx is not supported with block_table (nor in "
                            "flash-attn)")


def _cache_geometry(B, k_cache, v_cache, k, block_table, cache_batch_idx, cache_seqlens,
                    cache_leftpad) -> SimpleNamespace:
    """Where each sequence's keys lie in the cache, checked: paged (table, the cache's
    pages), else rows (the cache row of each sequence); capacity (slots per sequence),
    seqlens (keys already cached), new (keys appended), ends (seqlens + new) and starts
    (cache_leftpad), all (B,) int64."""
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if len(tuple(x.shape)) != 4:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has shape {tuple(x.shape)}; expected (B_cache, "
                                f"L_cache, Hkv, D) or paged (num_blocks, page_size, Hkv, D)")
    paged = block_table is not None
    table = rows = None
    if paged:
        table = np.asarray(_torch.to_numpy(block_table))
        if table.ndim != 2 or table.shape[0] != B or \
                not np.issubdtype(table.dtype, np.integer):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"block_table has shape {table.shape} and dtype {table.dtype}; "
                                f"expected integers ({B}, max_blocks)")
        capacity = table.shape[1] * k_cache.shape[1]
    else:
        capacity = k_cache.shape[1]
        rows = np.arange(B) if cache_batch_idx is None else \
            np.asarray(_torch.to_numpy(cache_batch_idx)).astype(np.int64)
        if rows.shape != (B,) or (rows < 0).any() or (rows >= k_cache.shape[0]).any():
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"cache_batch_idx must be ({B},) indices into the cache's "
                                f"{k_cache.shape[0]} rows")
        if cache_batch_idx is None and k_cache.shape[0] < B:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"k_cache has {k_cache.shape[0]} rows for a batch of {B}")
    if cache_seqlens is None:
        if k is not None:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "k and v are appended at cache_seqlens: give cache_seqlens")
        seqlens = np.full(B, capacity, np.int64)
    else:
        seqlens = np.broadcast_to(np.asarray(_torch.to_numpy(cache_seqlens)), (B,)).astype(
            np.int64)
    new = 0 if k is None else int(k.shape[1])
    ends = seqlens + new
    if (seqlens < 0).any() or (ends > capacity).any():
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"cache_seqlens {seqlens.tolist()} plus {new} new keys must fit the "
                            f"cache's {capacity} slots per sequence")
    starts = np.zeros(B, np.int64) if cache_leftpad is None else np.broadcast_to(
        np.asarray(_torch.to_numpy(cache_leftpad)), (B,)).astype(np.int64)
    if (starts < 0).any() or (starts > seqlens).any():
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"cache_leftpad {starts.tolist()} must be in 0 .. cache_seqlens")
    return SimpleNamespace(B=B, paged=paged, table=table, rows=rows, capacity=capacity,
                           pages=k_cache.shape[0], page_size=k_cache.shape[1], seqlens=seqlens,
                           new=new, ends=ends, starts=starts)


def _flat_rows(geo, b, positions):
    """The rows of the flattened cache (B_cache * L_cache or pages * page_size) that hold
    sequence b's key positions."""
    if geo.paged:
        page = geo.table[b, positions // geo.page_size].astype(np.int64)
        if ((page < 0) | (page >= geo.pages)).any():
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"block_table row {b} names a page outside the cache's "
                                f"{geo.pages}")
        return page * geo.page_size + positions % geo.page_size
    return geo.rows[b] * geo.capacity + positions


def _rotary(qn, k, v, rotary_cos, rotary_sin, geo, causal, window_size, interleaved):
    """(q, k, v) with flash-attn's rotary embedding applied: k at its cache positions, q at
    its own when causal or windowed, else at the cache's length."""
    ends, seqlens, Lq = geo.ends, geo.seqlens, qn.shape[1]
    cos = np.asarray(_torch.to_numpy(rotary_cos), dtype=np.float32)
    sin = np.asarray(_torch.to_numpy(rotary_sin), dtype=np.float32)
    if cos.ndim != 2 or cos.shape != sin.shape or 2 * cos.shape[1] > qn.shape[-1] or \
            cos.shape[0] < int(ends.max(initial=0)):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"rotary_cos/rotary_sin have shapes {cos.shape}, {sin.shape}; "
                            f"expected (seqlen_ro >= {int(ends.max(initial=0))}, "
                            f"rotary_dim / 2), rotary_dim <= {qn.shape[-1]}")
    kpos = seqlens[:, None] + np.arange(geo.new)[None, :]
    windowed = tuple(int(w) for w in window_size) != (-1, -1)
    qpos = seqlens[:, None] + (np.arange(Lq)[None, :] if causal or windowed else
                               np.zeros((1, Lq), np.int64))
    qn = _rotate(qn, cos, sin, qpos, interleaved).astype(qn.dtype)
    k_new = _rotate(np.asarray(_torch.to_numpy(k)), cos, sin, kpos, interleaved)
    return qn, k_new, np.asarray(_torch.to_numpy(v))


def _append(k_cache, v_cache, k_new, v_new, geo) -> None:
    """The new keys and values written into the caches in place at cache_seqlens."""
    flat_k = k_cache.reshape((-1,) + tuple(k_cache.shape[2:]))
    flat_v = v_cache.reshape((-1,) + tuple(v_cache.shape[2:]))
    if not _shares_memory(flat_k, k_cache) or not _shares_memory(flat_v, v_cache):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "k_cache and v_cache must be contiguous to be appended to in "
                            "place")
    for b in range(geo.B):
        where = _index(_flat_rows(geo, b, np.arange(geo.seqlens[b], geo.ends[b])), k_cache)
        flat_k[where] = _like(k_new[b], k_cache)
        flat_v[where] = _like(v_new[b], v_cache)


def _attend_gathered(qn, kc, vc, geo, causal, softmax_scale, window_size, softcap,
                     alibi_slopes, sinks, ctx, return_softmax_lse):
    """Each sequence's keys (cache_leftpad .. end) gathered into a packed batch and attended
    by the varlen kernel: (out (B, Lq, H, Dv), lse (B, H, Lq) or None)."""
    B, Lq = geo.B, qn.shape[1]
    idx = np.concatenate([_flat_rows(geo, b, np.arange(geo.starts[b], geo.ends[b]))
                          for b in range(B)])
    lengths = geo.ends - geo.starts
    if idx.size == 0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, "no sequence has a key")
    kf = kc.reshape((-1,) + kc.shape[2:])[idx]
    vf = vc.reshape((-1,) + vc.shape[2:])[idx]
    cu_q = np.arange(B + 1, dtype=np.int32) * Lq
    cu_k = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    pb = _flash._flash_problem(
        qn.reshape((B * Lq,) + qn.shape[2:]), kf, vf, cu_q, cu_k, None, None, causal,
        softmax_scale, window_size, softcap, _torch.to_numpy(alibi_slopes),
        _torch.to_numpy(sinks), None, ctx, "flash_attn_with_kvcache")
    out, lse = _flash._flash_forward(pb, return_softmax_lse)
    out = out.reshape((B, Lq) + out.shape[1:])
    if lse is not None:
        lse = np.ascontiguousarray(lse.reshape(lse.shape[0], B, Lq).transpose(1, 0, 2))
    return out, lse


def _shares_memory(view, base) -> bool:
    """Whether reshaping base gave a view (so writing into it writes into base)."""
    if _torch.is_tensor(base):
        return base.is_contiguous()
    return np.shares_memory(view, base)
