"""clattn.onnx_attention: the ONNX ``Attention`` operator (opset 23/24) on the clattn device."""

from __future__ import annotations

import ctypes
import math
from types import SimpleNamespace
from typing import Dict, Optional

import numpy as np

from . import _lib, _torch
from ._core import ArgumentError, Buffer, Context, clattn_dtype, default_context, layout
from ._lib import lib
from ._common import _PATHS, _is_pyopencl
from ._pyopencl import _context_for_queue


def _host(a):
    """A pyopencl array's contents on the host (numpy arrays as they are)."""
    return a.get() if _is_pyopencl(a) else a


def _array(name: str, value):
    if _is_pyopencl(value):  # used where it lies (float32/float16/bool/ints; no float64)
        if value.ndim == 0 or any(st % value.dtype.itemsize for st in value.strides) or \
                value.offset % value.dtype.itemsize:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name}: strides and offset must be whole elements")
        return value
    a = np.asarray(value)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    if a.dtype.kind not in "fV" and a.dtype != np.bool_:
        raise TypeError(f"clattn: {name} has dtype {a.dtype}; expected floats")
    return np.ascontiguousarray(a)


def _strides(a) -> tuple:
    """Element strides: packed for numpy arrays (made contiguous), the array's own for
    pyopencl ones."""
    if _is_pyopencl(a):
        return tuple(st // a.dtype.itemsize for st in a.strides)
    return tuple(int(x) for x in np.cumprod((a.shape[1:] + (1,))[::-1])[::-1])


def _heads_view(name: str, a, heads: Optional[int]):
    """(dims, strides) of a (B, H, L, d) view: rank 4 as is, rank 3 (B, L, H*d) split into
    `heads` heads (ONNX's q_num_heads / kv_num_heads) without a copy."""
    st = _strides(a)
    if a.ndim == 4:
        if heads is not None and heads != a.shape[1]:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has {a.shape[1]} heads but the attribute says {heads}")
        return tuple(a.shape), st
    if a.ndim == 3:
        if not heads:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name} is 3-d (B, L, H*d): give its number of heads "
                                f"(q_num_heads / kv_num_heads)")
        b, l, width = a.shape
        if width % heads:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name}'s {width} features do not split into {heads} heads")
        d = width // heads
        return (b, heads, l, d), (st[0], d * st[2], st[1], st[2])
    raise ArgumentError(_lib.ERR_INVALID_SHAPE, f"{name} has {a.ndim} dims; expected 3 or 4")


@_torch.torch_io("onnx_attention")
def onnx_attention(Q, K, V, attn_mask=None, past_key=None, past_value=None,
                   nonpad_kv_seqlen=None, *, is_causal: int = 0,
                   kv_num_heads: Optional[int] = None, q_num_heads: Optional[int] = None,
                   qk_matmul_output_mode: int = 0, scale: Optional[float] = None,
                   softcap: float = 0.0, softmax_precision: Optional[int] = None,
                   left_window_size: int = -1, right_window_size: int = -1,
                   want_qk_matmul_output: bool = False, ctx: Optional[Context] = None,
                   path: str = "auto") -> Dict[str, np.ndarray]:
    """ONNX ``Attention``: inputs and attributes by their ONNX names; returns a dict with
    ``Y`` and, as ONNX gives them, ``present_key`` and ``present_value`` (when past_key is
    given) and ``qk_matmul_output`` (when ``want_qk_matmul_output``; modes 0 to 3).

    Q (B, q_heads, q_seq, d) or (B, q_seq, q_heads * d) with q_num_heads (K and V likewise
    with kv_num_heads; kv heads divide q heads); float32, float16, bfloat16 (ml_dtypes) or
    float64 (computed in float32). attn_mask: bool (True = attend) or float (added), rank 1..4
    broadcasting to (B, q_heads, q_seq, total_seq); a shorter last dim is padded as masked
    (ONNX's rule). past_key/past_value (B, kv_heads, past, d). nonpad_kv_seqlen (B) integers:
    batch b's keys are 0 .. n[b] - 1. is_causal: ONNX's rule (the offset is the past length,
    else n[b] - q_seq). softmax_precision 11 (double) normalises in double (the unfused path,
    devices with fp64). Outputs take ONNX's types: Y and qk_matmul_output Q's, present_key K's,
    present_value V's. A fully masked row gives zeros.
    pyopencl arrays (Q, K and V all, float32/float16, any strides) are read where they lie and
    the outputs are pyopencl arrays on Q's queue; past_key/past_value, a full-length uint8,
    bool or float attn_mask and nonpad_kv_seqlen given as pyopencl arrays are used on the
    device too (a short or other mask is read back and padded on the host)."""
    _check_attributes(path, qk_matmul_output_mode, softmax_precision, scale, past_key,
                      past_value)
    device, queue = _device_queue(Q, K, V)
    if device:
        ctx = ctx or _context_for_queue(queue)
    ctx = ctx or default_context()
    pb = _problem(Q, K, V, past_key, past_value, kv_num_heads, q_num_heads, device)
    scores_role = None
    if want_qk_matmul_output:
        scores_role = "weights" if qk_matmul_output_mode == 3 else "scores"
    desc = _lib.SdpaDesc()
    lib.clattn_sdpa_desc_init(ctypes.byref(desc))
    mask = _bind_layouts(desc.tensors, pb, attn_mask)
    counts = _bind_counts(desc.tensors, pb, nonpad_kv_seqlen)
    if scores_role is not None:
        setattr(desc.tensors, scores_role, layout(_lib.F32, pb.scores_shape))
        desc.scores_mode = 0 if qk_matmul_output_mode == 3 else qk_matmul_output_mode
    desc.causal = _lib.CAUSAL_ONNX if is_causal else _lib.CAUSAL_NONE
    if left_window_size >= 0 or right_window_size >= 0:
        desc.window_align = _lib.CAUSAL_ONNX
        desc.window_left, desc.window_right = left_window_size, right_window_size
    desc.scale = float("nan") if scale is None else float(scale)
    desc.softcap = float(softcap)
    desc.softmax_f64 = 1 if softmax_precision == 11 else 0
    desc.path = _PATHS[path]
    inputs = (("q", pb.q), ("k", pb.k), ("v", pb.v), ("past_k", pb.pk), ("past_v", pb.pv),
              ("kv_seqlen", counts), ("attn_mask", None if mask is None else mask[0]))
    results = _execute(ctx, desc, pb, inputs, scores_role, queue if device else None)
    outputs: Dict[str, np.ndarray] = {"Y": results["out"]}
    if pb.pk is not None:
        outputs["present_key"] = results["present_k"]
        outputs["present_value"] = results["present_v"]
    if scores_role is not None:
        outputs["qk_matmul_output"] = results[scores_role].astype(pb.q.dtype)
    if not device and np.asarray(Q).dtype == np.float64:
        outputs = {name: a.astype(np.float64) for name, a in outputs.items()}
    return outputs


def _check_attributes(path, qk_matmul_output_mode, softmax_precision, scale, past_key,
                      past_value) -> None:
    """The attributes and options in their accepted ranges (ArgumentError naming them)."""
    if path not in _PATHS:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"path={path!r}: expected 'auto', 'fused' or 'unfused'")
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"qk_matmul_output_mode={qk_matmul_output_mode}: expected 0..3")
    if softmax_precision not in (None, 1, 11):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"softmax_precision={softmax_precision}: clattn takes 1 (float) "
                            f"or 11 (double)")
    if scale is not None and not math.isfinite(scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")
    if (past_key is None) != (past_value is None):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, "past_key and past_value go together")


def _device_queue(Q, K, V):
    """(device, queue): whether Q, K and V are pyopencl arrays (all or none, of one OpenCL
    context) and Q's queue if so."""
    device = any(_is_pyopencl(x) for x in (Q, K, V))
    queue = None
    if device:
        if not all(_is_pyopencl(x) for x in (Q, K, V)):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "Q, K and V must all be pyopencl arrays, or none")
        queue = Q.queue
        if any(x.context.int_ptr != queue.context.int_ptr for x in (Q, K, V)):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "Q, K and V belong to different OpenCL contexts")
    return device, queue


def _problem(Q, K, V, past_key, past_value, kv_num_heads, q_num_heads,
             device) -> SimpleNamespace:
    """Q, K, V (and the past cache) checked as the (B, H, L, d) views the plan takes: the
    arrays, their dims and strides, b, hq, lq, d, hkv, dv, total (past + new keys)."""
    q, k, v = _array("Q", Q), _array("K", K), _array("V", V)
    if not (q.ndim == k.ndim == v.ndim):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE, "Q, K and V must all be 3-d or all 4-d")
    q_view = _heads_view("Q", q, q_num_heads)
    kv_heads = kv_num_heads if kv_num_heads is not None else q_num_heads
    k_view = _heads_view("K", k, kv_heads)
    v_view = _heads_view("V", v, kv_heads)
    b, hq, lq, d = q_view[0]
    hkv, lk_new = k_view[0][1], k_view[0][2]
    dv = v_view[0][3]
    past = 0
    pk = pv = None
    if past_key is not None:
        pk, pv = _array("past_key", past_key), _array("past_value", past_value)
        if _is_pyopencl(pk) != device or _is_pyopencl(pv) != device:
            pk, pv = (_host(pk) if not device else pk), (_host(pv) if not device else pv)
        if pk.ndim != 4 or pv.ndim != 4 or pk.shape[:2] != (b, hkv) or \
                pv.shape[:3] != pk.shape[:3] or pk.shape[3] != d or pv.shape[3] != dv:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"past_key {pk.shape} and past_value {pv.shape}: expected "
                                f"({b}, {hkv}, P, {d}) and ({b}, {hkv}, P, {dv})")
        past = pk.shape[2]
    total = past + lk_new
    return SimpleNamespace(q=q, k=k, v=v, views=(q_view, k_view, v_view), pk=pk, pv=pv, b=b,
                           hq=hq, lq=lq, d=d, hkv=hkv, dv=dv, total=total,
                           rank3=q.ndim == 3, scores_shape=(b, hq, lq, total))


def _bind_layouts(t, pb, attn_mask):
    """The layouts of q, k, v, out, the mask and the past and present caches set on the
    descriptor's tensors t; returns the mask as (array, clattn dtype) or None (a short mask
    padded as masked, ONNX's rule; a pyopencl one of full length used where it lies)."""
    (q_dims, q_strides), (k_dims, k_strides), (v_dims, v_strides) = pb.views
    dt = {n: clattn_dtype(a.dtype) for n, a in (("q", pb.q), ("k", pb.k), ("v", pb.v))}
    t.q, t.k = layout(dt["q"], q_dims, q_strides), layout(dt["k"], k_dims, k_strides)
    t.v = layout(dt["v"], v_dims, v_strides)
    b, hq, lq, dv, total = pb.b, pb.hq, pb.lq, pb.dv, pb.total
    out_strides = (hq * lq * dv, dv, hq * dv, 1) if pb.rank3 else None
    t.out = layout(dt["q"], (b, hq, lq, dv), out_strides)
    mask = None
    if _is_pyopencl(attn_mask) and attn_mask.shape[-1] == total and \
            attn_mask.dtype in (np.bool_, np.uint8, np.float32, np.float16) and \
            1 <= attn_mask.ndim <= 4:  # used where it lies (a bool mask read as bytes)
        m = attn_mask.view(np.uint8) if attn_mask.dtype == np.bool_ else attn_mask
        mask = (m, _lib.U8 if m.dtype == np.uint8 else clattn_dtype(m.dtype))
        t.attn_mask = layout(mask[1], m.shape, _strides(m))
        attn_mask = None
    if attn_mask is not None:
        m = np.asarray(_host(attn_mask))
        if m.ndim < 1 or m.ndim > 4 or m.shape[-1] > total:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"attn_mask has shape {m.shape}; expected rank 1..4 with at "
                                f"most {total} keys")
        if m.shape[-1] < total:  # ONNX pads a short mask as masked
            pad = [(0, 0)] * (m.ndim - 1) + [(0, total - m.shape[-1])]
            m = np.pad(m, pad, constant_values=(False if m.dtype == np.bool_ else -np.inf))
        if m.dtype == np.bool_:
            mask = (np.ascontiguousarray(m.astype(np.uint8)), _lib.U8)
        else:
            m = _array("attn_mask", m)
            mask = (m, clattn_dtype(m.dtype))
        t.attn_mask = layout(mask[1], mask[0].shape)
    if pb.pk is not None:
        t.past_k = layout(clattn_dtype(pb.pk.dtype), pb.pk.shape, _strides(pb.pk))
        t.past_v = layout(clattn_dtype(pb.pv.dtype), pb.pv.shape, _strides(pb.pv))
        t.present_k = layout(dt["k"], (b, pb.hkv, total, pb.d))
        t.present_v = layout(dt["v"], (b, pb.hkv, total, dv))
    return mask


def _bind_counts(t, pb, nonpad_kv_seqlen):
    """nonpad_kv_seqlen as int32 (b,) (a pyopencl array converted on the device) with its
    layout set on t; None when not given."""
    if nonpad_kv_seqlen is None:
        return None
    if _is_pyopencl(nonpad_kv_seqlen):
        counts = nonpad_kv_seqlen
        if counts.dtype != np.int32:
            counts = counts.astype(np.int32)  # on the device
    else:
        counts = np.ascontiguousarray(np.asarray(nonpad_kv_seqlen), dtype=np.int32)
    if counts.shape != (pb.b,):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"nonpad_kv_seqlen has shape {counts.shape}, expected ({pb.b},)")
    t.kv_seqlen = layout(_lib.I32, (pb.b,), _strides(counts))
    return counts


def _execute(ctx, desc, pb, inputs, scores_role, queue) -> dict:
    """The plan made, run and released: the results by role (out, present_k/_v, the scores or
    weights), numpy arrays read back, or pyopencl arrays on queue (not None)."""
    plan = ctypes.c_void_p()
    ctx.check(lib.clattn_sdpa_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(plan)))
    keep: dict = {}
    try:
        if queue is not None:
            import pyopencl.array as cla

            def empty(shape, dtype):
                return cla.empty(queue, shape, dtype)
        else:
            empty = np.empty
        b, hq, lq, dv, total = pb.b, pb.hq, pb.lq, pb.dv, pb.total
        y = empty((b, lq, hq * dv) if pb.rank3 else (b, hq, lq, dv), pb.q.dtype)
        with ctx.lock:
            bound = _lib.Tensors()
            results = {"out": y}
            if pb.pk is not None:
                results["present_k"] = empty((b, pb.hkv, total, pb.d), pb.k.dtype)
                results["present_v"] = empty((b, pb.hkv, total, dv), pb.v.dtype)
            if scores_role is not None:
                results[scores_role] = empty(pb.scores_shape, np.float32)
            for role, array in inputs + tuple(results.items()):
                if array is None:
                    continue
                setattr(bound, role, getattr(desc.tensors, role))
                if _is_pyopencl(array):
                    getattr(bound, role).mem = array.base_data.int_ptr
                    getattr(bound, role).offset = array.offset // array.dtype.itemsize
                elif role in results:
                    keep[role] = Buffer(ctx, nbytes=array.nbytes)
                    getattr(bound, role).mem = keep[role].mem
                else:
                    keep[role] = Buffer(ctx, array)
                    getattr(bound, role).mem = keep[role].mem
            ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(bound), _lib.ROLE_COUNT,
                                              None, None, 0, None, None))
            if queue is not None:
                if keep:  # uploaded inputs must outlive the kernels that read them
                    ctx.check(lib.clattn_finish(ctx.handle))
            else:
                for role, array in results.items():
                    keep[role].read(ctx, array)
    finally:
        lib.clattn_plan_release(plan)
    return results
