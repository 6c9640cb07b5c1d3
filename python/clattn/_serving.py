"""Serving: attention over a paged KV cache (:func:`paged_attention`, vLLM's and flash-attn's
page layout, float or llama.cpp-quantized pools) and the block quantization it reads
(:func:`quantize`). clattn.flash_attn.flash_attn_with_kvcache and clattn.KVCache build on
the same fused paged kernel."""

from __future__ import annotations

import ctypes
import math
from types import SimpleNamespace
from typing import Optional

import numpy as np

from . import _lib, _torch
from ._common import _as_float, _fp8_scales, _needs_grad, _sdpa_plan, _sinks_array
from ._core import ArgumentError, ArrayLike, Buffer, Context, clattn_dtype, default_context, layout
from ._lib import lib


def paged_attention(query: ArrayLike, k_pages: ArrayLike, v_pages: ArrayLike,
                    block_table: ArrayLike, seqlens_k: ArrayLike, *, is_causal: bool = False,
                    scale: Optional[float] = None, sinks: Optional[ArrayLike] = None,
                    kv_dtype: Optional[str] = None, k_scale: Optional[float] = None,
                    v_scale: Optional[float] = None,
                    ctx: Optional[Context] = None) -> ArrayLike:
    """Attention over a paged KV cache (the pools in vLLM's and flash-attn's page layout), on
    the clattn device (the fused kernel reads the pages through the table).

    The query is clattn's (B, Hq, Lq, E), heads before rows, as scaled_dot_product_attention
    takes it, NOT flash-attn's (B, Lq, Hq, E): for flash-attn's own call (query (B, Lq, H, D),
    appending new keys, rotary, windows, softcap, ALiBi, lse) use
    :func:`clattn.flash_attn.flash_attn_with_kvcache`. A query whose dim 1 is not a multiple
    of the pools' Hkv is refused, with a hint when it looks transposed (a query with Hkv = 1,
    or one whose Lq and Hq are both multiples of Hkv, cannot be told apart: mind the order).

    query (B, Hq, Lq, E); k_pages (pages, page_size, Hkv, E) and v_pages (pages, page_size,
    Hkv, Ev) (flash-attn's paged k_cache/v_cache): float32, float16, bfloat16 (ml_dtypes) or
    float64 (computed in float32); block_table (B, blocks) and seqlens_k (B,) integers: key j
    of sequence b is slot j % page_size of page block_table[b, j // page_size], its keys
    0 .. seqlens_k[b] - 1. A sequence's pages need not be contiguous nor in order. Hkv divides
    Hq (query head h uses pool head h // (Hq // Hkv)).
    is_causal: per sequence, the queries being its last Lq keys (bottom-right). scale: None for
    1/sqrt(E). sinks: (Hq,) attention-sink logits (see scaled_dot_product_attention).
    kv_dtype: 'q8_0' or 'q4_0' (llama.cpp's block formats; E and Ev multiples of 32, else
    ArgumentError): float pools are quantized on the device first (``quantize``'s rounding),
    and uint8 pools are taken as those blocks as they are, (pages, page_size, Hkv,
    E // 32 * 34) for q8_0 (18 for q4_0), a ggml cache handed over byte for byte; the kernel
    dequantizes as it reads. kv_dtype 'fp8_e4m3' or 'fp8_e5m2' (since 0.12): vLLM's fp8 cache,
    one byte a value with per-tensor scales k_scale and v_scale (None: 1), a value being
    decode(code) * scale: float pools are encoded on the device (``quantize``'s rounding), uint8
    pools (pages, page_size, Hkv, E) are taken as the codes, and torch.float8_e4m3fn /
    torch.float8_e5m2 pools (torch 2.1+) as theirs, kv_dtype then implied.
    torch tensors in give a torch tensor out (every argument, kv_dtype included, reaches the
    same core as for numpy). Not differentiable (clattn's backward refuses paged caches): on
    tensors that require grad while torch records gradients it raises clattn.ArgumentError
    naming them, never a detached result. Raises clattn.ArgumentError naming the argument for
    a block index outside the pool (among a sequence's used blocks), a count past the
    table's pages, or shapes that do not fit. Returns (B, Hq, Lq, Ev) in query's dtype."""
    like = _torch.any_tensor(query, k_pages, v_pages)
    if like is not None:
        _refuse_grad(query, k_pages, v_pages, sinks)
        result = paged_attention(
            _torch.to_numpy(query), _torch.to_numpy(k_pages), _torch.to_numpy(v_pages),
            _torch.to_numpy(block_table), _torch.to_numpy(seqlens_k), is_causal=is_causal,
            scale=scale, sinks=_torch.to_numpy(sinks),
            kv_dtype=kv_dtype or _torch.fp8_kv_dtype(k_pages), k_scale=k_scale,
            v_scale=v_scale, ctx=ctx)
        return _torch.from_numpy(result, like)
    ctx = ctx or default_context()
    q_in = np.asarray(query)
    pools = _pools(query, k_pages, v_pages, kv_dtype)
    table = np.asarray(block_table)
    counts = np.asarray(seqlens_k)
    _check_pools(pools.q, pools.kp, pools.vp)
    _check_table(table, counts, pools.q.shape[0], pools.kp.shape[0], pools.kp.shape[1])
    if scale is not None and not math.isfinite(scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")
    sinks1 = _sinks_array(sinks, pools.q.shape[1])
    E = pools.q.shape[3]
    scales = _fp8_scales(kv_dtype, k_scale, v_scale)
    if pools.block is not None and pools.block[2] == 32 and (E % 32 or pools.vp.shape[-1] % 32):
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"kv_dtype={kv_dtype!r}: the head sizes (k {E}, v "
                            f"{pools.vp.shape[-1]}) must be multiples of 32 (a block holds 32 "
                            f"values)")
    out = _paged_execute(ctx, pools, table, counts, sinks1, is_causal, scale, scales)
    return out.astype(q_in.dtype) if q_in.dtype == np.float64 else out


def _refuse_grad(query, k_pages, v_pages, sinks) -> None:
    """paged_attention has no backward: tensors that require grad (while torch records
    gradients) are refused, naming them, never given a detached result."""
    if _needs_grad(query, k_pages, v_pages, sinks):
        names = [n for n, x in (("query", query), ("k_pages", k_pages),
                                ("v_pages", v_pages), ("sinks", sinks))
                 if getattr(x, "requires_grad", False)]
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"paged_attention is not differentiable: {', '.join(names)} "
                            f"require{'s' if len(names) == 1 else ''} grad, but clattn's "
                            f"backward refuses paged KV caches (as flash-attn's "
                            f"flash_attn_with_kvcache has none); call it under "
                            f"torch.no_grad() or pass detached tensors, or use "
                            f"varlen_attention for a differentiable packed batch")


def _pools(query, k_pages, v_pages, kv_dtype) -> SimpleNamespace:
    """The query and pools as floats, or, for a given uint8 cache of kv_dtype's blocks, the
    blocks as they are (kb, vb) with kp, vp empty float arrays of the shapes they hold
    (E from the bytes per row). block: kv_dtype's (clattn dtype, bytes per block) or None."""
    block = None  # (clattn dtype, bytes per block, values per block) with kv_dtype
    if kv_dtype is not None:
        block = _kv_type(kv_dtype)
    given_blocks = block is not None and np.asarray(k_pages).dtype == np.uint8
    if given_blocks:  # the blocks as a ggml cache holds them: E from the bytes per row
        kb, vb = np.asarray(k_pages), np.asarray(v_pages)
        if kb.ndim != 4 or vb.ndim != 4 or vb.dtype != np.uint8 or kb.shape[-1] % block[1] \
                or vb.shape[-1] % block[1]:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"k_pages {kb.shape} {kb.dtype}, v_pages {vb.shape} {vb.dtype}: "
                                f"{kv_dtype} blocks are uint8 (pages, page_size, Hkv, "
                                f"E // {block[2]} * {block[1]})")
        q = _as_float("query", query)
        per = block[2]
        kp = np.empty(kb.shape[:3] + (kb.shape[3] // block[1] * per,), np.float32)  # shapes only
        vp = np.empty(vb.shape[:3] + (vb.shape[3] // block[1] * per,), np.float32)
    else:
        q, kp, vp = (_as_float(n, a) for n, a in (("query", query), ("k_pages", k_pages),
                                                  ("v_pages", v_pages)))
        kb = vb = None
    return SimpleNamespace(q=q, kp=kp, vp=vp, kb=kb, vb=vb, block=block,
                           given_blocks=given_blocks)


def _kv_type(kv_dtype) -> tuple:
    """kv_dtype's (clattn dtype, bytes per block, values per block): llama.cpp's blocks of 32,
    or the 8-bit floats (a byte a value); ArgumentError for another name."""
    if kv_dtype in _lib.FP8_TYPES:
        return (_lib.FP8_TYPES[kv_dtype], 1, 1)
    if kv_dtype in _lib.BLOCK_TYPES:
        return _lib.BLOCK_TYPES[kv_dtype] + (32,)
    raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                        f"kv_dtype={kv_dtype!r}: expected 'q8_0', 'q4_0', 'fp8_e4m3' or "
                        f"'fp8_e5m2'")


def _check_pools(q, kp, vp) -> None:
    """The query's and pools' ranks, and the pools sharing pages, page size and heads (Hkv, a
    divisor of the query's heads) and k the query's head size (with a hint for a query in
    flash-attn's (B, Lq, H, D) order)."""
    if q.ndim != 4 or kp.ndim != 4 or vp.ndim != 4:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"query {q.shape}, k_pages {kp.shape}, v_pages {vp.shape}: expected "
                            f"(B, Hq, Lq, E), (pages, page_size, Hkv, E), (pages, page_size, "
                            f"Hkv, Ev)")
    B, Hq, Lq, E = q.shape
    pages, page_size, Hkv, Ek = kp.shape
    if vp.shape[:3] != kp.shape[:3] or Ek != E or Hkv == 0 or Hq % Hkv != 0:
        hint = ""
        if Hkv and Hq % Hkv and Lq % Hkv == 0:
            hint = (f"; query {q.shape} looks like flash-attn's (B, Lq, H, D): paged_attention "
                    f"takes (B, H, Lq, D) (pass query.transpose(1, 2)), or use "
                    f"clattn.flash_attn.flash_attn_with_kvcache, which takes (B, Lq, H, D)")
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"k_pages {kp.shape}, v_pages {vp.shape}, query {q.shape}: the pools "
                            f"must share pages, page size and heads (Hkv = {Hkv}, a divisor of "
                            f"the query's heads, dim 1 of (B, Hq, Lq, E)), and k the query's "
                            f"head size{hint}")


def _check_table(table, counts, B, pages, page_size) -> None:
    """block_table (B, blocks) and seqlens_k (B,) integers, each sequence's count within its
    blocks and its used blocks pages of the pool."""
    if not np.issubdtype(table.dtype, np.integer) or table.ndim != 2 or table.shape[0] != B \
            or table.shape[1] == 0:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"block_table has shape {table.shape} and dtype {table.dtype}; "
                            f"expected integers (B, blocks) = ({B}, blocks >= 1)")
    if not np.issubdtype(counts.dtype, np.integer) or counts.shape != (B,):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"seqlens_k has shape {counts.shape} and dtype {counts.dtype}; "
                            f"expected integers ({B},)")
    blocks = table.shape[1]
    for b in range(B):
        n = int(counts[b])
        if not 0 <= n <= blocks * page_size:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"seqlens_k[{b}] = {n} is not in 0 .. {blocks * page_size}: "
                                f"block_table holds {blocks} blocks of {page_size} keys")
        used = table[b, :(n + page_size - 1) // page_size]
        bad = np.nonzero((used < 0) | (used >= pages))[0]
        if bad.size:
            j = int(bad[0])
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"block_table[{b}, {j}] = {int(used[j])} is not a page of the "
                                f"pool (0 .. {pages - 1}); sequence {b} has {n} keys")


def _paged_execute(ctx, pools, table, counts, sinks1, is_causal, scale,
                   scales=(0.0, 0.0)) -> np.ndarray:
    """The fused paged kernel on the checked arrays (float pools of kv_dtype quantized on the
    device first): out (B, Hq, Lq, Ev) in the query's computed dtype."""
    q, kp, vp, block, given_blocks = pools.q, pools.kp, pools.vp, pools.block, pools.given_blocks
    B, Hq, Lq, E = q.shape
    pages = kp.shape[0]
    qc = np.ascontiguousarray(q)
    kc, vc = (np.ascontiguousarray(a) for a in ((pools.kb, pools.vb) if given_blocks else (kp, vp)))
    table32 = np.ascontiguousarray(np.where((table >= 0) & (table < pages), table, -1),
                                   dtype=np.int32)
    counts32 = np.ascontiguousarray(counts, dtype=np.int32)
    dtypes = (clattn_dtype(qc.dtype),) + ((block[0], block[0]) if block is not None else
                                          (clattn_dtype(kc.dtype), clattn_dtype(vc.dtype)))
    Ev = vp.shape[-1]
    out = np.empty((B, Hq, Lq, Ev), dtype=qc.dtype)

    def tensors():
        t = _lib.Tensors()
        t.q = layout(dtypes[0], qc.shape)
        t.k = layout(dtypes[1], kp.shape)
        t.v = layout(dtypes[2], vp.shape)
        t.out = layout(dtypes[0], out.shape)
        t.block_table = layout(_lib.I32, table32.shape)
        t.kv_seqlen = layout(_lib.I32, counts32.shape)
        if sinks1 is not None:
            t.sinks = layout(_lib.F32, sinks1.shape)
        return t

    key_ = ("paged", qc.shape, kp.shape, vp.shape, dtypes, table32.shape, bool(is_causal), scale,
            sinks1 is not None, scales)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        t, src = desc.tensors, tensors()
        for name in ("q", "k", "v", "out", "block_table", "kv_seqlen", "sinks"):
            setattr(t, name, getattr(src, name))
        desc.causal = _lib.CAUSAL_BOTTOM_RIGHT if is_causal else _lib.CAUSAL_NONE
        desc.scale = float("nan") if scale is None else float(scale)
        desc.path = _lib.PATH_FUSED
        desc.k_scale, desc.v_scale = scales
        return _sdpa_plan(ctx, desc)

    with ctx.lock:
        plan = ctx.plan(key_, create)
        arrays = [qc, kc, vc, table32, counts32] + ([sinks1] if sinks1 is not None else [])
        buffers = [Buffer(ctx, a) for a in arrays] + [Buffer(ctx, nbytes=out.nbytes)]
        t = tensors()
        t.q.mem, t.k.mem, t.v.mem = buffers[0].mem, buffers[1].mem, buffers[2].mem
        if block is not None and not given_blocks:  # float pools: quantized on the device
            for i, (name, pool) in enumerate((("k", kc), ("v", vc))):
                src = layout(clattn_dtype(pool.dtype), pool.shape)
                src.mem = buffers[1 + i].mem
                blocks = Buffer(ctx, nbytes=pool.size // block[2] * block[1])
                buffers.append(blocks)
                getattr(t, name).mem = blocks.mem
                ctx.check(lib.clattn_quantize_scaled(ctx.handle, ctypes.byref(src),
                                                     ctypes.byref(getattr(t, name)), scales[i],
                                                     0, None, None))
        t.block_table.mem, t.kv_seqlen.mem = buffers[3].mem, buffers[4].mem
        if sinks1 is not None:
            t.sinks.mem = buffers[5].mem
        t.out.mem = buffers[len(arrays)].mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(t), _lib.ROLE_COUNT, None, None, 0,
                                          None, None))
        buffers[len(arrays)].read(ctx, out)
    return out


def paged_varlen_attention(q: ArrayLike, k_pages: ArrayLike, v_pages: ArrayLike,
                           cu_seqlens_q: ArrayLike, block_table: ArrayLike, seqlens_k: ArrayLike,
                           *, causal: bool = False, softmax_scale: Optional[float] = None,
                           softcap: float = 0.0, sinks: Optional[ArrayLike] = None,
                           return_lse: bool = False, ctx: Optional[Context] = None):
    """A serving step's attention in one fused launch: packed query rows of B requests (each
    decoding, one row, or prefilling a chunk, many rows) over one paged KV cache (chunked
    prefill and a mixed batch; the C API's cu_seqlens_q with block_table and kv_seqlen).

    q (total_q, Hq, E) packed as flash-attn's varlen functions take it: request b's rows are
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 ((B + 1,) integers from 0, non-decreasing, ending
    at total_q). k_pages (pages, page_size, Hkv, E), v_pages (pages, page_size, Hkv, Ev):
    flash-attn's paged caches; block_table (B, blocks) and seqlens_k (B,) integers: request b
    attends its first seqlens_k[b] keys, key j in slot j % page_size of page
    block_table[b, j // page_size] (a chunk's own keys already written there). causal:
    bottom-right per request (row i of n rows over N keys sees keys j <= i + N - n).
    softmax_scale: None for 1/sqrt(E); softcap > 0 caps the scores; sinks (Hq,) logits.
    float32, float16, bfloat16 (ml_dtypes) or float64 (computed in float32); torch tensors in
    give torch tensors out. Not differentiable (clattn's backward refuses paged caches: tensors
    that require grad are refused). Raises clattn.ArgumentError naming the argument for
    offsets, counts or block indices that are not as above. Returns out (total_q, Hq, Ev) in
    q's dtype, or with return_lse ``(out, lse)``, lse float32 (Hq, total_q), -inf for a row
    that sees no key."""
    like = _torch.any_tensor(q, k_pages, v_pages)
    if like is not None:
        _refuse_grad(q, k_pages, v_pages, sinks)
        got = paged_varlen_attention(
            *(_torch.to_numpy(a) for a in (q, k_pages, v_pages, cu_seqlens_q, block_table,
                                            seqlens_k)),
            causal=causal, softmax_scale=softmax_scale, softcap=softcap,
            sinks=_torch.to_numpy(sinks), return_lse=return_lse, ctx=ctx)
        if return_lse:
            return _torch.from_numpy(got[0], like), _torch.from_numpy(got[1], like)
        return _torch.from_numpy(got, like)
    ctx = ctx or default_context()
    q_in = np.asarray(q)
    qf, kp, vp = (_as_float(n, a) for n, a in (("q", q), ("k_pages", k_pages),
                                               ("v_pages", v_pages)))
    if qf.ndim != 3:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"q has shape {qf.shape}; expected packed rows (total_q, Hq, E)")
    _check_pools(qf.transpose(1, 0, 2)[None], kp, vp)
    cu = np.asarray(cu_seqlens_q)
    if not np.issubdtype(cu.dtype, np.integer) or cu.ndim != 1 or cu.size < 2:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"cu_seqlens_q has shape {cu.shape} and dtype {cu.dtype}; expected "
                            f"(B + 1,) integers, B >= 1")
    if cu[0] != 0 or cu[-1] != qf.shape[0] or np.any(np.diff(cu) < 0):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"cu_seqlens_q = {cu.tolist()[:8]}...: the offsets must run from 0 to "
                            f"total_q = {qf.shape[0]} and never decrease")
    table, counts = np.asarray(block_table), np.asarray(seqlens_k)
    _check_table(table, counts, cu.size - 1, kp.shape[0], kp.shape[1])
    if softmax_scale is not None and not math.isfinite(softmax_scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"softmax_scale={softmax_scale}: must be "
                            f"finite")
    sinks1 = _sinks_array(sinks, qf.shape[1])
    out, lse = _mixed_execute(ctx, qf, kp, vp, cu, table, counts, sinks1,
                              (bool(causal), softmax_scale, float(softcap)))
    out = out.astype(q_in.dtype) if q_in.dtype == np.float64 else out
    return (out, lse) if return_lse else out


def _mixed_execute(ctx, q, kp, vp, cu, table, counts, sinks1, rule):
    """paged_varlen_attention's plan on the checked arrays: (out, lse)."""
    causal, scale, softcap = rule
    qc, kc, vc = (np.ascontiguousarray(a) for a in (q, kp, vp))
    arrays = [qc, kc, vc, np.ascontiguousarray(table, dtype=np.int32),
              np.ascontiguousarray(counts, dtype=np.int32), np.ascontiguousarray(cu, np.int32)]
    names = ["q", "k", "v", "block_table", "kv_seqlen", "cu_seqlens_q"]
    if sinks1 is not None:
        arrays.append(sinks1)
        names.append("sinks")
    total_q, Hq = qc.shape[:2]
    out = np.empty((total_q, Hq, vc.shape[-1]), dtype=qc.dtype)
    lse = np.empty((Hq, total_q), dtype=np.float32)

    def tensors():
        t = _lib.Tensors()
        for name, a in zip(names, arrays):
            setattr(t, name, layout(_lib.I32 if a.dtype == np.int32 else clattn_dtype(a.dtype),
                                    a.shape))
        t.out = layout(clattn_dtype(out.dtype), out.shape)
        t.lse = layout(_lib.F32, lse.shape)
        return t

    key_ = ("paged varlen", tuple((a.shape, a.dtype.str) for a in arrays), rule)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        t, src = desc.tensors, tensors()
        for name in names + ["out", "lse"]:
            setattr(t, name, getattr(src, name))
        desc.causal = _lib.CAUSAL_BOTTOM_RIGHT if causal else _lib.CAUSAL_NONE
        desc.scale = float("nan") if scale is None else float(scale)
        desc.softcap = softcap
        desc.path = _lib.PATH_FUSED
        return _sdpa_plan(ctx, desc)

    with ctx.lock:
        plan = ctx.plan(key_, create)
        buffers = [Buffer(ctx, a) for a in arrays]
        results = [Buffer(ctx, nbytes=out.nbytes), Buffer(ctx, nbytes=lse.nbytes)]
        t = tensors()
        for name, buffer in zip(names, buffers):
            getattr(t, name).mem = buffer.mem
        t.out.mem, t.lse.mem = results[0].mem, results[1].mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(t), _lib.ROLE_COUNT, None, None, 0,
                                          None, None))
        results[0].read(ctx, out)
        results[1].read(ctx, lse)
    return out, lse


@_torch.torch_io("quantize")
def quantize(x: ArrayLike, kv_dtype: str, *, scale: Optional[float] = None,
             ctx: Optional[Context] = None) -> np.ndarray:
    """llama.cpp's block quantization on the clattn device: x (..., E) float32, float16,
    bfloat16 or float64, E a multiple of 32, rank 1 to 4; kv_dtype 'q8_0' (per 32 values an
    fp16 scale amax / 127 and int8 round(x / scale)) or 'q4_0' (an fp16 scale m / -8, m the
    value of largest magnitude, and nibbles min(15, int(x / scale + 8.5)), element j with
    j + 16 in one byte). Returns uint8 (..., E // 32 * 34) or (..., E // 32 * 18): ggml's
    block_q8_0 / block_q4_0 bytes, as ``paged_attention(kv_dtype=...)`` takes them.
    kv_dtype 'fp8_e4m3' or 'fp8_e5m2' (since 0.12; any E): the codes of x / scale (scale None:
    1), rounded to nearest even and saturated to the largest finite value (e4m3: +-448, no
    infinities; e5m2: +-57344, infinities kept), NaN to NaN: uint8 (..., E), which
    ``.view(torch.float8_e4m3fn)`` (or float8_e5m2) reads as torch's values."""
    code, size, per = _kv_type(kv_dtype)
    k_scale = _fp8_scales(kv_dtype, scale, None)[0]
    a = np.ascontiguousarray(_as_float("x", x))
    if not 1 <= a.ndim <= 4 or a.shape[-1] % per or 0 in a.shape:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"x has shape {a.shape}: expected rank 1 to 4 with the last "
                            f"dimension a multiple of {per}")
    ctx = ctx or default_context()
    out = np.empty(a.shape[:-1] + (a.shape[-1] // per * size,), np.uint8)
    with ctx.lock:
        src_buf, dst_buf = Buffer(ctx, a), Buffer(ctx, nbytes=out.nbytes)
        src, dst = layout(clattn_dtype(a.dtype), a.shape), layout(code, a.shape)
        src.mem, dst.mem = src_buf.mem, dst_buf.mem
        ctx.check(lib.clattn_quantize_scaled(ctx.handle, ctypes.byref(src), ctypes.byref(dst),
                                             k_scale, 0, None, None))
        dst_buf.read(ctx, out)
    return out


def kv_commit(k_cache: ArrayLike, v_cache: Optional[ArrayLike], kv_seqlen: ArrayLike,
              accepted: ArrayLike, draft_len: int, *, block_table: Optional[ArrayLike] = None,
              kv_dtype: Optional[str] = None, ctx: Optional[Context] = None) -> tuple:
    """Speculative decoding's commit (clattn_kv_commit, on the clattn device): after a
    verification step wrote each sequence's ``draft_len`` draft tokens after its keys (draft
    token t of sequence b at key kv_seqlen[b] + t), keeps the accepted path's rows and drops
    the rest: key kv_seqlen[b] + accepted[b, i] moves to kv_seqlen[b] + i for i = 0, 1, .. and
    kv_seqlen[b] grows by the number taken. A list ends at its first entry that is not above
    the one before it (-1 pads a short list), not below draft_len, or whose rows lie outside
    the cache (past its capacity, or, paged, in a block whose index is outside the pool); a
    negative kv_seqlen[b] leaves sequence b alone.

    k_cache (B, Hkv, capacity, E) contiguous, or with block_table (B, blocks) the pools
    (pages, page_size, Hkv, E) as :func:`paged_attention` takes them; v_cache the same with
    Ev, or None (keys only: e.g. one latent cache whose values are a view of its keys).
    float32, float16 or bfloat16 (ml_dtypes); with kv_dtype 'q8_0' / 'q4_0' uint8 rows of
    blocks (..., E // 32 * 34 / 18 bytes) as :func:`quantize` gives them. kv_seqlen (B,) and
    accepted (B, A) integers. Returns (k_cache, v_cache, kv_seqlen): new arrays (v_cache None
    when given None), the inputs unchanged; torch tensors in give torch tensors out."""
    like = _torch.any_tensor(k_cache, v_cache, kv_seqlen, accepted, block_table)
    if like is not None:
        if _needs_grad(k_cache, v_cache):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "kv_commit: k_cache/v_cache require grad, but the commit moves "
                                "cache rows and records no gradient: pass detached caches")
        conv = [None if a is None else _torch.to_numpy(a)
                for a in (k_cache, v_cache, kv_seqlen, accepted, block_table)]
        k, v, n = kv_commit(conv[0], conv[1], conv[2], conv[3], draft_len, block_table=conv[4],
                            kv_dtype=kv_dtype, ctx=ctx)
        return tuple(None if a is None else _torch.from_numpy(a, like) for a in (k, v, n))
    caches = [_commit_cache(name, a, kv_dtype) for name, a in (("k_cache", k_cache),
                                                             ("v_cache", v_cache))]
    ints = {name: None if a is None else np.ascontiguousarray(a, dtype=np.int32)
            for name, a in (("kv_seqlen", kv_seqlen), ("accepted", accepted),
                            ("block_table", block_table))}
    for name, rank in (("kv_seqlen", 1), ("accepted", 2), ("block_table", 2)):
        if ints[name] is not None and ints[name].ndim != rank:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has shape {ints[name].shape}: expected rank {rank}")
    ctx = ctx or default_context()
    desc = _lib.KvCommitDesc()
    lib.clattn_kv_commit_desc_init(ctypes.byref(desc))
    desc.draft_len = int(draft_len)
    out = {}
    with ctx.lock:
        buffers = []
        for field, (array, code, shape) in zip(("k", "v"), caches):
            if array is None:
                continue
            buf = Buffer(ctx, array, writable=True)
            buffers.append((field, buf, array))
            t = layout(code, shape)
            t.mem = buf.mem
            setattr(desc, field, t)
        for name, array in ints.items():
            if array is None:
                continue
            buf = Buffer(ctx, array, writable=name == "kv_seqlen")
            buffers.append((name, buf, array))
            t = layout(_lib.I32, array.shape)
            t.mem = buf.mem
            setattr(desc, name, t)
        ctx.check(lib.clattn_kv_commit(ctx.handle, ctypes.byref(desc), 0, None, None))
        for name, buf, array in buffers:
            if name in ("k", "v", "kv_seqlen"):
                out[name] = np.empty_like(array)
                buf.read(ctx, out[name])
    return out["k"], out.get("v"), out["kv_seqlen"]


def _commit_cache(name, array, kv_dtype):
    """(array, clattn dtype, element shape) of a cache for kv_commit, (None, 0, None) absent."""
    if array is None:
        if name == "k_cache":
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, "k_cache is None")
        return None, 0, None
    a = np.asarray(array)
    if kv_dtype is not None:
        if kv_dtype not in _lib.BLOCK_TYPES or a.dtype != np.uint8:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name}: kv_dtype={kv_dtype!r} takes uint8 rows of 'q8_0' or "
                                f"'q4_0' blocks, got {a.dtype}")
        code, size = _lib.BLOCK_TYPES[kv_dtype]
        if a.ndim != 4 or a.shape[-1] % size:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has shape {a.shape}: expected rank 4 with rows of whole "
                                f"{size}-byte blocks")
        return np.ascontiguousarray(a), code, a.shape[:3] + (a.shape[3] // size * 32,)
    a = np.ascontiguousarray(a)
    if a.ndim != 4:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE, f"{name} has shape {a.shape}: expected rank 4")
    return a, clattn_dtype(a.dtype), a.shape
