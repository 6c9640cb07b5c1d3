"""Attention states and shared prefixes: :func:`merge_state` (FlashInfer's
``flashinfer.merge_state``, clattn_merge_states) and :func:`cascade_decode` (a decode step whose
requests share one stored prefix: the prefix attended once for the whole batch, each suffix per
request, the two states merged; clattn_cascade_*).

The log-sum-exp here is the natural-log one that clattn's ``return_lse`` gives
(``torch.logsumexp`` of the scaled scores). FlashInfer's kernels return base 2 by default:
multiply theirs by ``math.log(2)`` before merging them here."""

from __future__ import annotations

import ctypes
import math
from typing import Optional

import numpy as np

from . import _lib, _torch
from ._common import _as_float
from ._core import ArgumentError, ArrayLike, Buffer, Context, clattn_dtype, default_context, layout
from ._lib import lib


def _bound(ctx: Context, array: np.ndarray, buffers: list, dtype: Optional[int] = None,
           shape=None, strides=None) -> _lib.Tensor:
    """A tensor of array's (or the given view's) layout on a new device copy of array."""
    a = np.ascontiguousarray(array)
    buf = Buffer(ctx, a)
    buffers.append(buf)
    t = layout(clattn_dtype(a.dtype) if dtype is None else dtype,
               a.shape if shape is None else shape, strides)
    t.mem = buf.mem
    return t


@_torch.torch_io("merge_state")
def merge_state(v_a: ArrayLike, s_a: ArrayLike, v_b: ArrayLike, s_b: ArrayLike, *,
                ctx: Optional[Context] = None):
    """Merges two partial attention results of the same query rows over disjoint key sets into
    the result over their union (FlashInfer's ``merge_state``): per row, m = max(s_a, s_b),
    w = exp(s - m), v = (w_a v_a + w_b v_b) / (w_a + w_b), s = m + log(w_a + w_b).

    v_a, v_b (seq_len, num_heads, head_dim) (any rank 2 to 4, (rows.., head_dim)): float32,
    float16, bfloat16 or float64 (computed in float32); s_a, s_b: v's shape without head_dim,
    the natural-log log-sum-exp (float32). A row whose s is -inf saw no key and changes nothing
    (the other side is returned bit for bit); both -inf give zeros and -inf. Associative.
    torch tensors in give torch tensors out. Returns (v, s): v in v_a's dtype, s float32."""
    va, vb = _as_float("v_a", v_a), _as_float("v_b", v_b)
    sa, sb = (np.asarray(s, dtype=np.float32) for s in (s_a, s_b))
    if va.shape != vb.shape or not 2 <= va.ndim <= 4 or 0 in va.shape:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"v_a {va.shape} and v_b {vb.shape}: expected one shape of rank 2 "
                            f"to 4, (rows.., head_dim)")
    for name, s in (("s_a", sa), ("s_b", sb)):
        if s.shape != va.shape[:-1]:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has shape {s.shape}: expected {va.shape[:-1]} (v's "
                                f"shape without head_dim)")
    ctx = ctx or default_context()
    v = np.empty(va.shape, va.dtype)
    s = np.empty(sa.shape, np.float32)
    with ctx.lock:
        keep: list = []
        ta, tsa = _bound(ctx, va, keep), _bound(ctx, sa, keep)
        tb, tsb = _bound(ctx, vb, keep), _bound(ctx, sb, keep)
        out_buf, lse_buf = Buffer(ctx, nbytes=v.nbytes), Buffer(ctx, nbytes=s.nbytes)
        to, ts = layout(clattn_dtype(v.dtype), v.shape), layout(_lib.F32, s.shape)
        to.mem, ts.mem = out_buf.mem, lse_buf.mem
        ctx.check(lib.clattn_merge_states(ctx.handle, *(ctypes.byref(t) for t in
                                                        (ta, tsa, tb, tsb, to, ts)),
                                          0, None, None))
        out_buf.read(ctx, v)
        lse_buf.read(ctx, s)
    return v, s


@_torch.torch_io("cascade_decode")
def cascade_decode(q: ArrayLike, prefix_k: ArrayLike, prefix_v: ArrayLike, k_cache: ArrayLike,
                   v_cache: ArrayLike, seqlens_k: ArrayLike,
                   block_table: Optional[ArrayLike] = None, *, scale: Optional[float] = None,
                   return_lse: bool = False, ctx: Optional[Context] = None):
    """One decode step of B requests that share a prefix stored once (FlashInfer's
    shared-prefix batch decode): each request's row attends to the prefix and to its own suffix,
    computed as the prefix for all rows at once (its keys read once, not once per request),
    the suffixes per request, and a merge (:func:`merge_state`).

    q (B, H, D) (FlashInfer's decode query); prefix_k (P, Hkv, D) and prefix_v (P, Hkv, Dv)
    (NHD, one copy for the batch); the suffixes: with block_table (B, blocks), pools k_cache
    (pages, page_size, Hkv, D) and v_cache (pages, page_size, Hkv, Dv) as
    :func:`paged_attention` takes them, else padded k_cache (B, S, Hkv, D) and v_cache (B, S,
    Hkv, Dv); seqlens_k (B,): each request's suffix keys (0 for none). Hkv divides H (GQA).
    float32, float16, bfloat16 or float64 (computed in float32). scale: None for 1/sqrt(D).
    Returns out (B, H, Dv) in q's dtype, and with return_lse the rows' natural-log lse (B, H)."""
    qa = _as_float("q", q)
    pk, pv = _as_float("prefix_k", prefix_k), _as_float("prefix_v", prefix_v)
    kc, vc = _as_float("k_cache", k_cache), _as_float("v_cache", v_cache)
    counts = np.ascontiguousarray(seqlens_k, dtype=np.int32)
    if qa.ndim != 3 or pk.ndim != 3 or pv.ndim != 3 or kc.ndim != 4 or vc.ndim != 4:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"q {qa.shape}, prefix_k {pk.shape}, prefix_v {pv.shape}, k_cache "
                            f"{kc.shape}, v_cache {vc.shape}: expected q (B, H, D), prefixes "
                            f"(P, Hkv, D), caches of rank 4")
    if scale is not None and not math.isfinite(scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")
    B, H, D = qa.shape
    P, G, Dv = pv.shape
    if counts.shape != (B,):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"seqlens_k has shape {counts.shape}: expected ({B},)")
    ctx = ctx or default_context()
    out = np.empty((B, H, Dv), qa.dtype)
    lse = np.empty((B, H), np.float32)
    keep: list = []
    with ctx.lock:
        d = _lib.CascadeDesc()
        lib.clattn_cascade_desc_init(ctypes.byref(d))
        d.q = _bound(ctx, qa, keep, shape=(B, H, 1, D), strides=(H * D, D, D, 1))
        d.prefix_k = _bound(ctx, pk, keep, shape=(1, G, P, D), strides=(P * G * D, D, G * D, 1))
        d.prefix_v = _bound(ctx, pv, keep, shape=(1, G, P, Dv),
                            strides=(P * G * Dv, Dv, G * Dv, 1))
        if block_table is not None:
            d.k, d.v = _bound(ctx, kc, keep), _bound(ctx, vc, keep)
            d.block_table = _bound(ctx, np.asarray(block_table, np.int32), keep, dtype=_lib.I32)
        else:
            S = kc.shape[1]
            d.k = _bound(ctx, kc, keep, shape=(B, G, S, D), strides=(S * G * D, D, G * D, 1))
            d.v = _bound(ctx, vc, keep, shape=(B, G, S, Dv), strides=(S * G * Dv, Dv, G * Dv, 1))
        d.kv_seqlen = _bound(ctx, counts, keep, dtype=_lib.I32)
        out_buf, lse_buf = Buffer(ctx, nbytes=out.nbytes), Buffer(ctx, nbytes=lse.nbytes)
        d.out = layout(clattn_dtype(out.dtype), (B, H, 1, Dv))
        d.lse = layout(_lib.F32, (B, H, 1))
        d.out.mem, d.lse.mem = out_buf.mem, lse_buf.mem
        d.scale = float("nan") if scale is None else float(scale)
        handle = ctypes.c_void_p()
        ctx.check(lib.clattn_cascade_create(ctx.handle, ctypes.byref(d), ctypes.byref(handle)))
        try:
            ctx.check(lib.clattn_cascade_execute(handle, ctypes.byref(d), 0, None, None))
            out_buf.read(ctx, out)
            lse_buf.read(ctx, lse)
        finally:
            lib.clattn_cascade_release(handle)
    return (out, lse) if return_lse else out
