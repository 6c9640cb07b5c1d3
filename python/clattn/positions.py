"""Positional encodings, rotary embeddings and the KV cache, as the C library has them."""

from __future__ import annotations

import ctypes
import math
from typing import Optional

import numpy as np

from . import _lib, _torch
from ._core import (BFLOAT16, ArgumentError, ArrayLike, Buffer, Context, clattn_dtype,
                    default_context, layout)
from ._lib import lib
from ._common import _PATHS, _as_float, _fp8_scales, _is_pyopencl, _needs_grad, _sdpa_plan


def _storage_dtype(dtype) -> np.dtype:
    """A numpy dtype from a numpy or torch dtype or a name ('float16', 'bfloat16', ...)."""
    name = getattr(dtype, "__module__", "") == "torch" and str(dtype).replace("torch.", "")
    if name or isinstance(dtype, str):
        name = name or dtype
        if name == "bfloat16":
            if BFLOAT16 is None:
                raise TypeError("clattn: a bfloat16 cache needs ml_dtypes (pip install "
                                "ml_dtypes)")
            return BFLOAT16
        try:
            return np.dtype(name)
        except TypeError:
            raise TypeError(f"clattn: dtype {dtype!r}: expected float32, float16, bfloat16, "
                            f"'q8_0' or 'q4_0'") from None
    return np.dtype(dtype)

def _fp8_name(dtype) -> Optional[str]:
    """'fp8_e4m3' / 'fp8_e5m2' for those names or torch's float8_e4m3fn / float8_e5m2."""
    if isinstance(dtype, str):
        return dtype if dtype in _lib.FP8_TYPES else None
    name = str(dtype).replace("torch.", "") if getattr(dtype, "__module__", "") == "torch" else ""
    return {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}.get(name)


_STYLES = {"halves": _lib.ROPE_HALVES, "pairs": _lib.ROPE_PAIRS}


@_torch.torch_io("positional_encoding")
def _positional_encoding_host(x, **options):
    return positional_encoding(x, **options)


def positional_encoding(x=None, *, seq: Optional[int] = None, dim: Optional[int] = None,
                        start: int = 0, base: float = 10000.0, table=None,
                        ctx: Optional[Context] = None) -> np.ndarray:
    """*Attention Is All You Need*'s sinusoidal table, or a learned ``table`` (max_len, dim),
    for positions start .. start + seq - 1 (clattn_posenc_plan_create).

    With ``x`` ((seq, dim), (batch, seq, dim) or rank 4; numpy, float32/float16/bfloat16/
    float64): returns x + PE in x's dtype. Without x: returns the (seq, dim) table, float32.
    PE(pos, 2k) = sin(pos / base^(2k/dim)), PE(pos, 2k+1) = cos(...); the angle is reduced in
    extended precision on the device (within about 1e-6 below position 2^24).
    torch tensors in give torch tensors out (x's dtype and device); on tensors that require
    grad the sum is formed in torch (its gradient is the identity for x, and the used rows
    for a learned table), the sinusoidal table coming from the device."""
    like = _torch.any_tensor(x, table)
    if like is not None and _needs_grad(x, table):
        if table is not None:
            n = x.shape[-2] if x is not None else int(seq)
            rows = (table if _torch.is_tensor(table) else
                    _torch.from_numpy(np.asarray(table), like))[int(start):int(start) + n]
        else:
            pe = positional_encoding(seq=x.shape[-2], dim=x.shape[-1], start=start,
                                     base=base, ctx=ctx)
            rows = _torch.from_numpy(pe, like)
        return rows if x is None else x + rows.to(x.dtype)
    if like is not None:
        return _positional_encoding_host(x, seq=seq, dim=dim, start=start, base=base,
                                         table=table, ctx=ctx)
    ctx = ctx or default_context()
    if x is not None:
        x_in = np.asarray(x)
        xa = _as_float("x", x_in)
        if xa.ndim < 2 or xa.ndim > 4:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"x has {xa.ndim} dims; expected (seq, dim) up to rank 4")
        shape, out_dtype = xa.shape, xa.dtype
    else:
        if seq is None or dim is None:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, "give x, or seq and dim")
        shape, out_dtype = (int(seq), int(dim)), np.dtype(np.float32)
    desc = _lib.PosencDesc()
    lib.clattn_posenc_desc_init(ctypes.byref(desc))
    desc.kind = _lib.POSENC_TABLE if table is not None else _lib.POSENC_SINUSOIDAL
    desc.start, desc.base = int(start), float(base)
    t = desc.tensors
    keep = []
    if x is not None:
        t.q = layout(clattn_dtype(xa.dtype), shape)
    t.out = layout(clattn_dtype(out_dtype), shape)
    tab = None
    if table is not None:
        tab = _as_float("table", table)
        t.pos_table = layout(clattn_dtype(tab.dtype), tab.shape)
    plan = ctypes.c_void_p()
    ctx.check(lib.clattn_posenc_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(plan)))
    try:
        out = np.empty(shape, out_dtype)
        with ctx.lock:
            bound = _lib.Tensors()
            result = Buffer(ctx, nbytes=out.nbytes)
            keep.append(result)
            bound.out = layout(clattn_dtype(out_dtype), shape)
            bound.out.mem = result.mem
            if x is not None:
                keep.append(Buffer(ctx, xa))
                bound.q = layout(clattn_dtype(xa.dtype), shape)
                bound.q.mem = keep[-1].mem
            if tab is not None:
                keep.append(Buffer(ctx, tab))
                bound.pos_table = layout(clattn_dtype(tab.dtype), tab.shape)
                bound.pos_table.mem = keep[-1].mem
            ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(bound), _lib.ROLE_COUNT,
                                              None, None, 0, None, None))
            result.read(ctx, out)
    finally:
        lib.clattn_plan_release(plan)
    if x is not None and x_in.dtype == np.float64:
        return out.astype(np.float64)
    return out


@_torch.torch_io("rotary_embedding")
def rotary_embedding(x, *, style: str = "halves", rotary_dim: Optional[int] = None,
                     base: float = 10000.0, start: int = 0, position_ids=None,
                     ctx: Optional[Context] = None) -> np.ndarray:
    """Rotary position embeddings (RoPE; clattn_rope_plan_create) on x (batch, heads, seq,
    head_dim): the first ``rotary_dim`` columns (None: all) of each row turned pair by pair by
    pos * base^(-2j / rotary_dim); pairs (x[j], x[j + r/2]) for ``style="halves"`` (GPT-NeoX,
    Llama) or (x[2j], x[2j+1]) for ``"pairs"`` (RoFormer). Positions: ``position_ids``
    (batch, seq) integers, else start + s. Returns x's shape and dtype."""
    if style not in _STYLES:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"style={style!r}: expected 'halves' or 'pairs'")
    ctx = ctx or default_context()
    x_in = np.asarray(x)
    xa = _as_float("x", x_in)
    if xa.ndim != 4:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"x has shape {xa.shape}; expected (batch, heads, seq, head_dim)")
    desc = _lib.RopeDesc()
    lib.clattn_rope_desc_init(ctypes.byref(desc))
    desc.style = _STYLES[style]
    desc.rotary_dim = _lib.ROPE_WHOLE_HEAD if rotary_dim is None else int(rotary_dim)
    desc.base, desc.start = float(base), int(start)
    dtype = clattn_dtype(xa.dtype)
    desc.tensors.q = layout(dtype, xa.shape)
    desc.tensors.out = layout(dtype, xa.shape)
    ids = None
    if position_ids is not None:
        ids = np.ascontiguousarray(np.asarray(position_ids), dtype=np.int32)
        if ids.shape != (xa.shape[0], xa.shape[2]):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"position_ids has shape {ids.shape}, expected "
                                f"({xa.shape[0]}, {xa.shape[2]})")
        desc.tensors.position_ids = layout(_lib.I32, ids.shape)
    plan = ctypes.c_void_p()
    ctx.check(lib.clattn_rope_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(plan)))
    try:
        out = np.empty(xa.shape, xa.dtype)
        with ctx.lock:
            src, dst = Buffer(ctx, xa), Buffer(ctx, nbytes=out.nbytes)
            bound = _lib.Tensors()
            bound.q, bound.out = layout(dtype, xa.shape), layout(dtype, xa.shape)
            bound.q.mem, bound.out.mem = src.mem, dst.mem
            id_buffer = None
            if ids is not None:
                id_buffer = Buffer(ctx, ids)
                bound.position_ids = layout(_lib.I32, ids.shape)
                bound.position_ids.mem = id_buffer.mem
            ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(bound), _lib.ROLE_COUNT,
                                              None, None, 0, None, None))
            dst.read(ctx, out)
    finally:
        lib.clattn_plan_release(plan)
    return out.astype(np.float64) if x_in.dtype == np.float64 else out


def _bind(t, q, out, cache) -> None:
    """q, out and a KV cache's (k, v, lengths, block table) set on t (a descriptor's tensors
    or a call's)."""
    t.q, t.out = q, out
    t.k, t.v, t.kv_seqlen, t.block_table = cache


class KVCache:
    """Keys and values of a fixed capacity on the device, for decoding (clattn_kv_cache):
    ``append(k, v)`` adds (batch, kv_heads, T, head_dim) steps on the device, ``attend(q)``
    runs one query block (batch, heads, Lq, head_dim) against every key so far (causal,
    bottom-right: the queries are the last Lq positions), with one plan per query shape that
    serves every step (the fill level is read on the device).

    ``page_size`` > 0 makes it paged: keys and values in a pool of ``num_pages`` pages
    (default: room for every sequence to fill) of ``page_size`` keys, found through a block
    table; appends take the lowest free page unless ``map_pages`` gave the block one.

    dtype: the storage type, numpy's or torch's (float32, float16, bfloat16) or its name; or
    'q8_0' / 'q4_0', llama.cpp's blocks (head sizes multiples of 32, else ArgumentError, as
    paged_attention): appends take float32 keys and values and quantize them on the device;
    attention dequantizes as it reads (the fused path). 'fp8_e4m3' / 'fp8_e5m2' (or
    torch.float8_e4m3fn / torch.float8_e5m2; since 0.12): vLLM's fp8 cache, one byte a value,
    appends storing the codes of k / k_scale and v / v_scale (None: 1), attention reading
    decode(code) * scale. Torch tensors in (append, attend)
    give torch tensors out; the cache is not differentiable (a query that requires grad is
    refused with TypeError)."""

    def __init__(self, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 head_dim_v: Optional[int] = None, dtype=np.float32, *,
                 page_size: int = 0, num_pages: int = 0, k_scale: Optional[float] = None,
                 v_scale: Optional[float] = None, ctx: Optional[Context] = None):
        self.ctx = ctx or default_context()
        fp8 = _fp8_name(dtype)
        block = _lib.BLOCK_TYPES.get(dtype) if isinstance(dtype, str) else None
        block = (_lib.FP8_TYPES[fp8], 1) if fp8 else block
        self._scales = _fp8_scales(fp8, k_scale, v_scale)
        if block and not fp8 and (head_dim % 32 or (head_dim_v or head_dim) % 32):
            raise ArgumentError(_lib.ERR_UNSUPPORTED,
                                f"dtype={dtype!r}: the head sizes (k {head_dim}, v "
                                f"{head_dim_v or head_dim}) must be multiples of 32 (a block "
                                f"holds 32 values)")
        self.dtype = np.dtype(np.float32) if block else _storage_dtype(dtype)  # appends take
        desc = _lib.KvCacheDesc()
        lib.clattn_kv_cache_desc_init(ctypes.byref(desc))
        desc.batch, desc.kv_heads, desc.capacity = batch, kv_heads, capacity
        desc.head_dim_qk = head_dim
        desc.head_dim_v = head_dim_v if head_dim_v is not None else head_dim
        desc.dtype = block[0] if block else clattn_dtype(self.dtype)
        desc.page_size, desc.num_pages = page_size, num_pages
        desc.k_scale, desc.v_scale = self._scales
        self.page_size = page_size
        self._handle = ctypes.c_void_p()
        self.ctx.check(lib.clattn_kv_cache_create(self.ctx.handle, ctypes.byref(desc),
                                                  ctypes.byref(self._handle)))
        self.shape = (batch, kv_heads, capacity, head_dim, desc.head_dim_v)
        self._plans: dict = {}

    def __len__(self) -> int:
        return int(lib.clattn_kv_cache_length(self._handle))

    def append(self, key: ArrayLike, value: ArrayLike) -> None:
        """Appends (batch, kv_heads, T, head_dim) keys and values (numpy, the cache's dtype or
        convertible to it; or pyopencl arrays of the cache's dtype on its context, any
        strides, copied on the device); past the capacity it raises, naming it."""
        if _is_pyopencl(key) or _is_pyopencl(value):
            kt, vt = self._device(key, "key"), self._device(value, "value")
            with self.ctx.lock:
                self.ctx.check(lib.clattn_kv_cache_append(self._handle, ctypes.byref(kt),
                                                          ctypes.byref(vt), 0, None, None))
            return
        k = np.ascontiguousarray(np.asarray(_torch.to_numpy(key)), dtype=self.dtype)
        v = np.ascontiguousarray(np.asarray(_torch.to_numpy(value)), dtype=self.dtype)
        dtype = clattn_dtype(self.dtype)
        with self.ctx.lock:
            kb, vb = Buffer(self.ctx, k), Buffer(self.ctx, v)
            kt, vt = layout(dtype, k.shape), layout(dtype, v.shape)
            kt.mem, vt.mem = kb.mem, vb.mem
            self.ctx.check(lib.clattn_kv_cache_append(self._handle, ctypes.byref(kt),
                                                      ctypes.byref(vt), 0, None, None))
            self.ctx.check(lib.clattn_finish(self.ctx.handle))  # the staging buffers go next

    def map_pages(self, table: ArrayLike) -> None:
        """Paged caches: gives the pages of the pool that blocks take (batch,
        ceil(capacity / page_size)) int32; -1 leaves a block as it is. Raises, naming the
        entry, for a page outside the pool, one page twice or a filled block remapped."""
        t = np.ascontiguousarray(np.asarray(table), dtype=np.int32)
        blocks = -(-self.shape[2] // self.page_size) if self.page_size else 0
        if t.shape != (self.shape[0], blocks):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"table has shape {t.shape}; expected ({self.shape[0]}, "
                                f"{blocks}) (batch, ceil(capacity / page_size))")
        self.ctx.check(lib.clattn_kv_cache_map_pages(
            self._handle, t.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), 0, None, None))

    def reset(self) -> None:
        """Empties the cache (length 0, on the host and the device); plans are kept."""
        self.ctx.check(lib.clattn_kv_cache_reset(self._handle, 0, None, None))

    def attend(self, query: ArrayLike, *, scale: Optional[float] = None,
               path: str = "auto") -> ArrayLike:
        """Attention of query (batch, heads, Lq, head_dim) (heads a multiple of kv_heads:
        grouped-query) over the cache's keys so far, causal bottom-right. Returns (batch,
        heads, Lq, head_dim_v) in query's dtype: a numpy array, or for a pyopencl query (on
        the cache's context; any strides) a pyopencl array enqueued on the cache's queue (make
        the cache with ``ctx=clattn.Context.from_pyopencl(queue)``), no host copy."""
        if path not in _PATHS:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"path={path!r}: expected 'auto', 'fused' or 'unfused'")
        if scale is not None and not math.isfinite(scale):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")
        like = _torch.any_tensor(query)
        if like is not None:  # torch in, torch out
            if _needs_grad(query):
                raise TypeError("clattn.KVCache.attend is not differentiable (an inference "
                                "cache) and query requires grad: call it under "
                                "torch.no_grad(), or use clattn.scaled_dot_product_attention")
            return _torch.from_numpy(self.attend(_torch.to_numpy(query), scale=scale,
                                                 path=path), like, like.dtype)
        device = _is_pyopencl(query)
        q = self._device(query, "query") if device else \
            np.ascontiguousarray(_as_float("query", query))
        if device:
            return self._attend_device(query, q, scale, path)
        if q.ndim != 4:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"query has shape {q.shape}; expected (batch, heads, Lq, d)")
        cache = self._cache_tensors()
        dtype = clattn_dtype(q.dtype)
        out_shape = q.shape[:3] + (self.shape[4],)
        plan = self._plan((q.shape, dtype, scale, path), layout(dtype, q.shape),
                          layout(dtype, out_shape), cache, scale, path)
        out = np.empty(out_shape, q.dtype)
        with self.ctx.lock:
            qb, ob = Buffer(self.ctx, q), Buffer(self.ctx, nbytes=out.nbytes)
            bound = _lib.Tensors()
            _bind(bound, layout(dtype, q.shape), layout(dtype, out_shape), cache)
            bound.q.mem, bound.out.mem = qb.mem, ob.mem
            self.ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(bound), _lib.ROLE_COUNT,
                                                   None, None, 0, None, None))
            ob.read(self.ctx, out)
        return out

    def step(self, query: ArrayLike, key: ArrayLike, value: ArrayLike, *,
             scale: Optional[float] = None) -> ArrayLike:
        """One decode step in one launch (clattn_kv_cache_decode): appends key and value
        (batch, kv_heads, 1, head_dim) and returns the attention of query (batch, heads, 1,
        head_dim) over the cache's keys and the new one, (batch, heads, 1, head_dim_v) in
        query's dtype. The fused kernel reads the new key and value from the step's inputs
        and writes them into the cache, so the append is no launch of its own (on devices
        and caches whose kernel has no step, q8_0/q4_0 among them, the same result in two).
        Equal to ``append(key, value)`` then ``attend(query)``. Numpy or torch (torch out)."""
        if scale is not None and not math.isfinite(scale):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")
        like = _torch.any_tensor(query, key, value)
        if like is not None:  # torch in, torch out
            if _needs_grad(query):
                raise TypeError("clattn.KVCache.step is not differentiable (an inference "
                                "cache) and query requires grad: call it under "
                                "torch.no_grad()")
            out = self.step(_torch.to_numpy(query), _torch.to_numpy(key),
                            _torch.to_numpy(value), scale=scale)
            return _torch.from_numpy(out, like, like.dtype)
        q = np.ascontiguousarray(_as_float("query", query))
        if q.ndim != 4 or q.shape[2] != 1:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"query has shape {q.shape}; expected (batch, heads, 1, d): "
                                f"one new token per step")
        # the new rows in the query's dtype (the fused kernel reads them as it reads q)
        k = np.ascontiguousarray(np.asarray(_torch.to_numpy(key)), dtype=q.dtype)
        v = np.ascontiguousarray(np.asarray(_torch.to_numpy(value)), dtype=q.dtype)
        cache = self._cache_tensors()
        dtype = clattn_dtype(q.dtype)
        out_shape = q.shape[:3] + (self.shape[4],)
        plan = self._plan((q.shape, dtype, scale, "step"), layout(dtype, q.shape),
                          layout(dtype, out_shape), cache, scale, "auto", kv_step=True)
        out = np.empty(out_shape, q.dtype)
        with self.ctx.lock:
            qb, ob = Buffer(self.ctx, q), Buffer(self.ctx, nbytes=out.nbytes)
            kb, vb = Buffer(self.ctx, k), Buffer(self.ctx, v)
            kt, vt = layout(dtype, k.shape), layout(dtype, v.shape)
            kt.mem, vt.mem = kb.mem, vb.mem
            bound = _lib.Tensors()
            _bind(bound, layout(dtype, q.shape), layout(dtype, out_shape), cache)
            bound.q.mem, bound.out.mem = qb.mem, ob.mem
            self.ctx.check(lib.clattn_kv_cache_decode(
                self._handle, plan, ctypes.byref(kt), ctypes.byref(vt), ctypes.byref(bound),
                _lib.ROLE_COUNT, None, 0, None, None))
            ob.read(self.ctx, out)
        return out

    def _device(self, a, name: str) -> _lib.Tensor:
        """A pyopencl array of the cache's context as a tensor bound where it lies."""
        if not _is_pyopencl(a):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name}: mix of pyopencl and host arrays; give both as "
                                f"pyopencl arrays")
        if a.context.int_ptr != lib.clattn_ctx_cl_context(self.ctx.handle):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name} is not on the cache's OpenCL context: make the cache "
                                f"with ctx=clattn.Context.from_pyopencl(queue)")
        if a.ndim != 4:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has shape {a.shape}; expected (batch, heads, T, d)")
        item = a.dtype.itemsize
        if any(st % item for st in a.strides) or a.offset % item:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name}: strides and offset must be whole elements")
        t = layout(clattn_dtype(a.dtype), a.shape, [st // item for st in a.strides])
        t.mem, t.offset = a.base_data.int_ptr, a.offset // item
        return t

    def _attend_device(self, query, q: _lib.Tensor, scale, path):
        import pyopencl.array as cla
        cache = self._cache_tensors()
        out_shape = tuple(query.shape[:3]) + (self.shape[4],)
        out = cla.empty(query.queue, out_shape, query.dtype)
        o = layout(q.dtype, out_shape)
        o.mem = out.base_data.int_ptr
        o.offset = out.offset // out.dtype.itemsize
        key_ = ("device", q.dtype, tuple(q.dims), tuple(q.strides), scale, path)
        plan = self._plan(key_, q, o, cache, scale, path)
        bound = _lib.Tensors()
        _bind(bound, q, o, cache)
        with self.ctx.lock:
            self.ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(bound), _lib.ROLE_COUNT,
                                                   None, None, 0, None, None))
        return out

    def _cache_tensors(self) -> tuple:
        """The cache's k, v, lengths and block table as tensors bound to its buffers."""
        k_t, v_t, len_t, bt_t = _lib.Tensor(), _lib.Tensor(), _lib.Tensor(), _lib.Tensor()
        lib.clattn_kv_cache_tensors(self._handle, ctypes.byref(k_t), ctypes.byref(v_t),
                                    ctypes.byref(len_t))
        lib.clattn_kv_cache_block_table(self._handle, ctypes.byref(bt_t))
        return k_t, v_t, len_t, bt_t

    def _plan(self, key_, q, out, cache, scale, path, kv_step=False):
        """The attend plan for key_ (made on its first use, kept until close): the query
        bottom-right aligned on the cache's keys (kv_step: a decode step's plan)."""
        plan = self._plans.get(key_)
        if plan is None:
            desc = _lib.SdpaDesc()
            lib.clattn_sdpa_desc_init(ctypes.byref(desc))
            _bind(desc.tensors, q, out, cache)
            desc.causal = _lib.CAUSAL_BOTTOM_RIGHT
            desc.kv_step = int(kv_step)
            desc.scale = float("nan") if scale is None else float(scale)
            desc.path = _PATHS[path]
            desc.k_scale, desc.v_scale = self._scales
            plan = _sdpa_plan(self.ctx, desc)
            self._plans[key_] = plan
        return plan

    def close(self) -> None:
        """Releases the cache's buffers and plans (idempotent)."""
        for plan in self._plans.values():
            lib.clattn_plan_release(plan)
        self._plans = {}
        if getattr(self, "_handle", None):
            lib.clattn_kv_cache_release(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
