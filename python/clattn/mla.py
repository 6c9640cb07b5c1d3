"""Multi-head latent attention (DeepSeek V2/V3, Kimi K2; MLA) in its absorbed form over a paged
latent cache, in FlashInfer's argument style (:func:`mla_decode`, after
``flashinfer.mla.BatchMLAPagedAttentionWrapper``'s plan and run): one shared latent KV head
for all the query heads, d_qk = 512 latent + 64 rotary columns, d_v = 512 (the latent). The
fused kernel reads V as a view of K's rows (their first 512 columns): the cache holds each
token once, 576 values."""

from __future__ import annotations

import ctypes
import math
from typing import Optional

import numpy as np

from . import _lib, _torch
from ._common import _as_float, _sdpa_plan
from ._core import ArgumentError, ArrayLike, Buffer, Context, clattn_dtype, default_context, layout
from ._lib import lib

LATENT, ROPE = 512, 64


def mla_decode(q_nope: ArrayLike, q_pe: ArrayLike, ckv_cache: ArrayLike,
               kpe_cache: Optional[ArrayLike], kv_indptr: ArrayLike, kv_indices: ArrayLike,
               kv_len: ArrayLike, *, sm_scale: float, causal: bool = False,
               qo_indptr: Optional[ArrayLike] = None, kv_dtype: Optional[str] = None,
               ctx: Optional[Context] = None) -> ArrayLike:
    """Absorbed MLA over a paged latent cache, FlashInfer's BatchMLAPagedAttentionWrapper in one
    call (its plan's and run's arguments, same names and shapes).

    q_nope (nnz_q, H, 512): the queries' non-rotary part already multiplied by W_UK^T (the
    absorption); q_pe (nnz_q, H, 64): their rotary part. ckv_cache (num_pages, page_size, 512)
    and kpe_cache (num_pages, page_size, 64): the latent c and the rotary keys. kv_indptr
    (B + 1,), kv_indices (kv_indptr[-1],): request b's pages are kv_indices[kv_indptr[b] ..
    kv_indptr[b + 1]] (FlashInfer's CSR page table); kv_len (B,): its key counts.
    sm_scale: required, 1/sqrt(d_nope + d_rope) before absorption (DeepSeek: 1/sqrt(192)),
    as FlashInfer's plan takes it. causal: the queries are each request's last rows
    (bottom-right). qo_indptr: None for one query row per request (decode, nnz_q = B), else
    (B + 1,) offsets with the same row count for every request (a few speculative or chunked
    rows; a ragged one is refused). kv_dtype: None (the caches' float32 or float16 as given),
    or 'q8_0' (llama.cpp's blocks, quantized on the device: 576 = 18 blocks a row, V's 512 =
    16). Returns (nnz_q, H, 512), the latent output (multiply by W_UV per head): float16 for
    float16 queries, else float32; torch tensors in give a torch tensor out.

    Differences from FlashInfer: clattn keeps a token's latent and rotary parts in one
    576-wide row (ckv then kpe), so separate ckv_cache and kpe_cache are concatenated (a
    copy, per call); pass kpe_cache=None with ckv_cache already (num_pages, page_size, 576)
    to skip it (clattn's own layout, what a cache should hold). No plan/run split (the plan
    is cached per shape by the context), no lse, out or CUDA graphs; q8_0 caches are clattn's
    addition. Raises clattn.ArgumentError naming the argument for shapes that do not fit,
    pages outside the pool, counts past a request's pages or a ragged qo_indptr."""
    like = _torch.any_tensor(q_nope, q_pe, ckv_cache, kpe_cache)
    if like is not None:
        args = [_torch.to_numpy(a) for a in (q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr,
                                              kv_indices, kv_len, qo_indptr)]
        result = mla_decode(*args[:7], sm_scale=sm_scale, causal=causal, qo_indptr=args[7],
                            kv_dtype=kv_dtype, ctx=ctx)
        return _torch.from_numpy(result, like)
    qn, qp = _as_float("q_nope", q_nope), _as_float("q_pe", q_pe)
    if qn.ndim != 3 or qn.shape[2] != LATENT or qp.shape != qn.shape[:2] + (ROPE,):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"q_nope {qn.shape}, q_pe {qp.shape}: expected (nnz_q, H, {LATENT}) "
                            f"and (nnz_q, H, {ROPE})")
    if not math.isfinite(sm_scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"sm_scale={sm_scale}: must be finite")
    cache = _latent_cache(ckv_cache, kpe_cache)
    table, counts = _block_table(kv_indptr, kv_indices, kv_len, cache.shape[0], cache.shape[1])
    B, (nnz, H) = counts.shape[0], qn.shape[:2]
    rows = _rows_per_request(qo_indptr, B, nnz)
    dtype = np.float16 if qn.dtype == np.float16 and qp.dtype == np.float16 else np.float32
    q = np.concatenate([qn, qp], axis=2).astype(dtype, copy=False)  # (nnz, H, 576)
    q = np.ascontiguousarray(q.reshape(B, rows, H, LATENT + ROPE).transpose(0, 2, 1, 3))
    out = _execute(ctx or default_context(), q, cache, table, counts, sm_scale, causal, kv_dtype)
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3)).reshape(nnz, H, LATENT)


def _latent_cache(ckv_cache, kpe_cache) -> np.ndarray:
    """The cache as clattn reads it: (num_pages, page_size, 1, 576) rows [c, k_pe], contiguous
    (separate ckv and kpe caches concatenated; float16 kept, other floats as float32)."""
    ckv = _as_float("ckv_cache", ckv_cache)
    if kpe_cache is None:
        if ckv.ndim != 3 or ckv.shape[2] != LATENT + ROPE:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"ckv_cache {ckv.shape} without kpe_cache: expected (num_pages, "
                                f"page_size, {LATENT + ROPE}) rows [ckv, kpe]")
        joined = ckv
    else:
        kpe = _as_float("kpe_cache", kpe_cache)
        if ckv.ndim != 3 or ckv.shape[2] != LATENT or kpe.shape != ckv.shape[:2] + (ROPE,):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"ckv_cache {ckv.shape}, kpe_cache {kpe.shape}: expected "
                                f"(num_pages, page_size, {LATENT}) and (num_pages, page_size, "
                                f"{ROPE})")
        joined = np.concatenate([ckv, kpe.astype(ckv.dtype, copy=False)], axis=2)
    if joined.dtype != np.float16:
        joined = joined.astype(np.float32, copy=False)
    return np.ascontiguousarray(joined)[:, :, None, :]


def _block_table(kv_indptr, kv_indices, kv_len, pages, page_size):
    """FlashInfer's CSR pages as clattn's (B, blocks) int32 table (-1 past a request's pages),
    checked, and the key counts."""
    indptr, indices, counts = (np.asarray(a) for a in (kv_indptr, kv_indices, kv_len))
    for name, a in (("kv_indptr", indptr), ("kv_indices", indices), ("kv_len", counts)):
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has shape {a.shape} and dtype {a.dtype}: expected a "
                                f"vector of integers")
    B = counts.shape[0]
    if B == 0 or indptr.shape != (B + 1,) or indptr[0] != 0 or np.any(np.diff(indptr) < 0) \
            or indptr[-1] > indices.shape[0]:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"kv_indptr {indptr.tolist()[:8]}: expected B + 1 = {B + 1} "
                            f"non-decreasing offsets from 0 into kv_indices ({indices.shape[0]})")
    used = indices[:indptr[-1]]  # every request's pages must be pages of the cache
    outside = np.flatnonzero((used < 0) | (used >= pages))
    if outside.size:
        at = int(outside[0])
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"kv_indices[{at}] = {int(used[at])} is not a page of the cache "
                            f"(0 .. {pages - 1})")
    held = np.diff(indptr) * page_size  # the keys each request's pages hold
    over = np.flatnonzero((counts < 0) | (counts > held))
    if over.size:
        b = int(over[0])
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"kv_len[{b}] = {int(counts[b])} is not in 0 .. {int(held[b])}: "
                            f"request {b} has {int(held[b]) // page_size} pages of {page_size}")
    table = np.full((B, max(1, int(np.diff(indptr).max()))), -1, np.int32)
    for b in range(B):
        table[b, :indptr[b + 1] - indptr[b]] = used[indptr[b]:indptr[b + 1]]
    return table, np.ascontiguousarray(counts, dtype=np.int32)


def _rows_per_request(qo_indptr, B, nnz) -> int:
    """Query rows per request: 1 without qo_indptr, else its (uniform) step."""
    if qo_indptr is None:
        if nnz != B:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"q_nope has {nnz} rows for {B} requests: decode takes one row "
                                f"per request (give qo_indptr for more)")
        return 1
    indptr = np.asarray(qo_indptr)
    steps = np.diff(indptr) if indptr.ndim == 1 else np.array([])
    if indptr.shape != (B + 1,) or indptr[0] != 0 or indptr[-1] != nnz or steps.min() < 1 \
            or np.any(steps != steps[0]):
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"qo_indptr {indptr.tolist()[:8]}: mla_decode takes the same number "
                            f"of query rows (>= 1) for each of the {B} requests, offsets from 0 "
                            f"to nnz_q = {nnz} (ragged rows over a paged cache are not "
                            f"supported)")
    return int(steps[0])


def _execute(ctx, q, cache, table, counts, sm_scale, causal, kv_dtype) -> np.ndarray:
    """The fused SDPA plan: q (B, H, L, 576) over the latent pool, V the view of its first 512
    columns (one buffer); out (B, H, L, 512) in q's dtype."""
    if kv_dtype not in (None, "q8_0"):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"kv_dtype={kv_dtype!r}: expected None or 'q8_0'")
    B, H, L, D = q.shape
    out = np.empty((B, H, L, LATENT), dtype=q.dtype)
    kv_code = _lib.Q8_0 if kv_dtype == "q8_0" else clattn_dtype(cache.dtype)

    def tensors():
        t = _lib.Tensors()
        t.q = layout(clattn_dtype(q.dtype), q.shape)
        t.k = layout(kv_code, cache.shape)
        t.v = layout(kv_code, cache.shape[:3] + (LATENT,), strides=tuple(t.k.strides))
        t.out = layout(clattn_dtype(out.dtype), out.shape)
        t.block_table = layout(_lib.I32, table.shape)
        t.kv_seqlen = layout(_lib.I32, counts.shape)
        return t

    key_ = ("mla", q.shape, q.dtype.str, cache.shape, kv_code, table.shape, bool(causal),
            float(sm_scale))

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        t, src = desc.tensors, tensors()
        for name in ("q", "k", "v", "out", "block_table", "kv_seqlen"):
            setattr(t, name, getattr(src, name))
        desc.causal = _lib.CAUSAL_BOTTOM_RIGHT if causal else _lib.CAUSAL_NONE
        desc.scale = float(sm_scale)
        desc.path = _lib.PATH_FUSED
        return _sdpa_plan(ctx, desc)

    with ctx.lock:
        plan = ctx.plan(key_, create)
        buffers = [Buffer(ctx, a) for a in (q, cache, table, counts)]
        buffers.append(Buffer(ctx, nbytes=out.nbytes))
        t = tensors()
        t.q.mem, t.k.mem = buffers[0].mem, buffers[1].mem
        if kv_dtype == "q8_0":  # the float rows quantized on the device, 18 blocks each
            src = layout(clattn_dtype(cache.dtype), cache.shape)
            src.mem = buffers[1].mem
            blocks = Buffer(ctx, nbytes=cache.size // 32 * _lib.BLOCK_TYPES["q8_0"][1])
            buffers.append(blocks)
            t.k.mem = blocks.mem
            ctx.check(lib.clattn_quantize(ctx.handle, ctypes.byref(src), ctypes.byref(t.k), 0,
                                          None, None))
        t.v.mem = t.k.mem  # V: the first 512 columns of K's rows, the same buffer
        t.block_table.mem, t.kv_seqlen.mem, t.out.mem = (buffers[2].mem, buffers[3].mem,
                                                         buffers[4].mem)
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(t), _lib.ROLE_COUNT, None, None, 0,
                                          None, None))
        buffers[4].read(ctx, out)
    return out
