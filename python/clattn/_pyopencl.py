"""scaled_dot_product_attention on pyopencl arrays: read where they lie, the result enqueued
on the arrays' queue (no host round trip), one clattn context per pyopencl queue, and the
per-layout bound plans of repeated calls. pyopencl is imported on use only."""

from __future__ import annotations

import ctypes

import numpy as np

from . import _lib
from ._common import _Score, _as_float, _fill, _is_pyopencl, _plan_for, _sdpa_plan, _sinks_array
from ._core import ArgumentError, Buffer, Context, clattn_dtype, layout
from ._lib import lib

_queue_contexts: dict = {}


def _context_for_queue(queue) -> Context:
    """The clattn context on a pyopencl queue (made once per queue; it retains the queue)."""
    ctx = _queue_contexts.get(queue.int_ptr)
    if ctx is None:
        ctx = _queue_contexts[queue.int_ptr] = Context.from_pyopencl(queue)
    return ctx


def _device_layout(name: str, a, rank: int):
    """A pyopencl array as a clattn tensor bound to its buffer: (dims, strides) right-aligned
    to `rank` dims (leading dims of 1 with stride 0), offset and strides in elements."""
    if a.ndim < 2 or a.ndim > 4:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"{name} (a pyopencl array) has {a.ndim} dims; expected 2 to 4")
    if any(s % a.dtype.itemsize for s in a.strides) or a.offset % a.dtype.itemsize:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{name}: strides and offset must be whole elements")
    pad = rank - a.ndim
    dims = (1,) * pad + tuple(a.shape)
    strides = (0,) * pad + tuple(s // a.dtype.itemsize for s in a.strides)
    t = layout(clattn_dtype(a.dtype), dims, strides)
    t.mem = a.base_data.int_ptr if hasattr(a, "base_data") else a.data.int_ptr
    t.offset = a.offset // a.dtype.itemsize
    return t


def _sdpa_pyopencl(query, key, value, attn_mask, enable_gqa, ctx, sc: _Score, sinks=None,
                   drop=None):
    import pyopencl.array as cla
    arrays = (query, key, value)
    kind = type(query)
    same_kind = type(key) is kind and type(value) is kind
    queue = query.queue if same_kind else None
    if ctx is None and queue is not None:
        ctx = _context_for_queue(queue)
    fast_key = None
    if same_kind and sinks is None and drop is None and (
            attn_mask is None or (type(attn_mask) is kind and attn_mask.dtype != np.bool_)):
        # The cache key of these layouts; its entry checks the contexts per call.
        fast_key = ("sdpa-cl", query.shape, query.strides, query.dtype, key.shape, key.strides,
                    key.dtype, value.shape, value.strides, value.dtype,
                    None if attn_mask is None else
                    (attn_mask.shape, attn_mask.strides, attn_mask.dtype),
                    sc, bool(enable_gqa))
        with ctx.lock:
            bound = ctx.lookup(fast_key)
            if bound is not None:  # the same layouts as an earlier call: bind and launch
                return bound.run(ctx, queue, arrays if attn_mask is None else
                                 arrays + (attn_mask,))
    if not all(_is_pyopencl(a) for a in arrays):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "query, key and value must all be pyopencl arrays, or none")
    if any(a.context.int_ptr != queue.context.int_ptr for a in arrays):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "query, key and value belong to different OpenCL contexts")
    q, k, v = (_device_layout(n, a, 4) for n, a in zip(("query", "key", "value"), arrays))
    heads_q, heads_k = q.dims[1], k.dims[1]
    if heads_q != heads_k and not (enable_gqa and heads_q % heads_k == 0):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"query has {heads_q} heads, key and value {heads_k}: pass "
                            f"enable_gqa=True with a divisor of the query heads")
    out_shape = tuple(query.shape[:-1]) + (value.shape[-1],)
    out = cla.empty(queue, out_shape, query.dtype)
    o = _device_layout("out", out, 4)
    mask_t, keep = None, []
    if attn_mask is not None:
        if _is_pyopencl(attn_mask):
            m = attn_mask
            if m.dtype == np.bool_:
                raise TypeError("clattn: a pyopencl attn_mask must be uint8 (nonzero = takes "
                                "part) or float")
            dims = tuple(m.shape)
            strides = tuple(st // m.dtype.itemsize for st in m.strides)
            mask_t = layout(_lib.U8 if m.dtype == np.uint8 else clattn_dtype(m.dtype), dims,
                            strides)
            mask_t.mem = m.base_data.int_ptr if hasattr(m, "base_data") else m.data.int_ptr
            mask_t.offset = m.offset // m.dtype.itemsize
        else:
            m = np.asarray(attn_mask)
            m = m.astype(np.uint8) if m.dtype == np.bool_ else _as_float("attn_mask", m)
            if m.ndim > 4:
                raise ArgumentError(_lib.ERR_INVALID_SHAPE, "attn_mask has more than 4 dims")
            buffer = Buffer(ctx, np.ascontiguousarray(m))
            keep.append(buffer)
            mask_t = layout(_lib.U8 if m.dtype == np.uint8 else clattn_dtype(m.dtype), m.shape)
            mask_t.mem = buffer.mem

    sinks_t = None  # attention sinks: a pyopencl float32 (Hq,) array where it lies, or numpy's
    if sinks is not None:
        if _is_pyopencl(sinks):
            if sinks.dtype != np.float32 or tuple(sinks.shape) != (q.dims[1],):
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"sinks has shape {tuple(sinks.shape)} and dtype "
                                    f"{sinks.dtype}; expected float32 ({q.dims[1]},)")
            if sinks.strides[0] % 4 or sinks.offset % 4:
                raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                    "sinks: strides and offset must be whole elements")
            sinks_t = layout(_lib.F32, (q.dims[1],), (sinks.strides[0] // 4,))
            sinks_t.mem = sinks.base_data.int_ptr
            sinks_t.offset = sinks.offset // 4
        else:
            host = _sinks_array(sinks, q.dims[1])
            buffer = Buffer(ctx, host)
            keep.append(buffer)
            sinks_t = layout(_lib.F32, host.shape)
            sinks_t.mem = buffer.mem

    def shape_key(t):
        return (t.dtype, tuple(t.dims), tuple(t.strides))

    key_ = ("sdpa-device", shape_key(q), shape_key(k), shape_key(v), shape_key(o),
            None if mask_t is None else (mask_t.rank, shape_key(mask_t)), sc,
            None if sinks_t is None else shape_key(sinks_t), drop)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        desc.tensors.q, desc.tensors.k, desc.tensors.v, desc.tensors.out = q, k, v, o
        if mask_t is not None:
            desc.tensors.attn_mask = mask_t
        if sinks_t is not None:
            desc.tensors.sinks = sinks_t
        _fill(desc, sc, drop)
        return _sdpa_plan(ctx, desc)

    with ctx.lock:
        if fast_key is not None:
            plan = ctx.take(key_) or create()
            tensors = _lib.Tensors()
            tensors.q, tensors.k, tensors.v, tensors.out = q, k, v, o
            roles = ("q", "k", "v") if mask_t is None else ("q", "k", "v", "attn_mask")
            if mask_t is not None:
                tensors.attn_mask = mask_t
            bound = _DeviceBound(plan, tensors, roles, out_shape, query.dtype)
            ctx.store(fast_key, bound)
            return bound.run(ctx, queue, arrays if mask_t is None else arrays + (attn_mask,))
        tensors = _lib.Tensors()
        tensors.q, tensors.k, tensors.v, tensors.out = q, k, v, o
        if mask_t is not None:
            tensors.attn_mask = mask_t
        if sinks_t is not None:
            tensors.sinks = sinks_t
        with _plan_for(ctx, key_, create, drop) as plan:
            ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(tensors), _lib.ROLE_COUNT,
                                              None, None, 0, None, None))
            # the uploaded mask and sinks must outlive the kernels that read them, and so must
            # a dropout call's plan (released on leaving)
            if keep or drop is not None:
                ctx.check(lib.clattn_finish(ctx.handle))
    return out


class _DeviceBound:
    """A plan with its layouts for pyopencl arrays of fixed shapes, strides and dtypes: a call
    binds each array's buffer and offset, allocates the output and launches. In-order queues
    need no events; on an out-of-order queue the inputs' pending events are waited for and the
    output carries the launch's event."""

    def __init__(self, plan, tensors, roles, out_shape, out_dtype):
        self.plan = plan
        self.tensors = tensors
        self.slots = [getattr(tensors, role) for role in roles]  # views into tensors
        self.out_slot = tensors.out
        self.out_shape = tuple(out_shape)
        self.out_dtype = np.dtype(out_dtype)
        self.itemsizes = None

    def run(self, ctx, queue, arrays):
        import pyopencl.array as cla
        context = queue.context
        for a in arrays:
            if a.context != context:
                raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                    "query, key, value and attn_mask belong to different "
                                    "OpenCL contexts")
        for slot, a in zip(self.slots, arrays):
            offset, rest = divmod(a.offset, a.dtype.itemsize)
            if rest:
                raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                    "a pyopencl array's offset must be whole elements")
            slot.mem = a.base_data.int_ptr
            slot.offset = offset
        out = cla.empty(queue, self.out_shape, self.out_dtype)
        self.out_slot.mem = out.base_data.int_ptr
        self.out_slot.offset = out.offset // self.out_dtype.itemsize
        if not _out_of_order(ctx):
            ctx.check(lib.clattn_plan_execute(self.plan, ctypes.byref(self.tensors),
                                              _lib.ROLE_COUNT, None, None, 0, None, None))
            return out
        import pyopencl as cl
        waits = [e for a in arrays for e in a.events]
        wait_list = (ctypes.c_void_p * max(len(waits), 1))(*[e.int_ptr for e in waits])
        event = ctypes.c_void_p()
        ctx.check(lib.clattn_plan_execute(self.plan, ctypes.byref(self.tensors), _lib.ROLE_COUNT,
                                          None, None, len(waits), wait_list if waits else None,
                                          ctypes.byref(event)))
        out.add_event(cl.Event.from_int_ptr(event.value, retain=False))
        return out

    def release(self):
        if self.plan:
            lib.clattn_plan_release(self.plan)
            self.plan = None


def _out_of_order(ctx) -> bool:
    """Whether ctx's queue (a pyopencl one) runs out of order (asked once per context)."""
    flag = getattr(ctx, "_out_of_order", None)
    if flag is None:
        queue = getattr(ctx, "_pyopencl_queue", None)
        flag = False
        if queue is not None:
            import pyopencl as cl
            mode = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
            flag = bool(queue.properties & mode)
        ctx._out_of_order = flag
    return flag
