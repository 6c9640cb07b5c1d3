"""FlashAttention-style problems on numpy arrays, what clattn.varlen_attention and
clattn.flash_attn share: packed (cu_seqlens) or batched (B, L, H, D) arrays checked and bound
as the C plan takes them, the forward (with lse) and the backward, causal and windows
bottom-right aligned per sequence."""

from __future__ import annotations

import ctypes
import math
from types import SimpleNamespace
from typing import Optional

import numpy as np

from . import _lib
from ._common import _as_float, _plan_for, _sdpa_plan, _set_dropout, _sinks_array
from ._core import ArgumentError, Buffer, clattn_dtype, default_context, layout
from ._lib import lib
from .dropout import _probability


def _offsets(name: str, cu, total: int, count: Optional[int]) -> np.ndarray:
    """cu_seqlens checked as FlashAttention takes them: integers (B + 1,) from 0,
    non-decreasing, ending at the total rows; as int32."""
    a = np.asarray(cu)
    if not np.issubdtype(a.dtype, np.integer) or a.ndim != 1 or a.shape[0] < 2 or \
            (count is not None and a.shape[0] != count):
        want = f"({count},)" if count is not None else "(B + 1,), B >= 1"
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"{name} has shape {a.shape} and dtype {a.dtype}; expected integer "
                            f"offsets {want}")
    if int(a[0]) != 0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{name}[0] = {int(a[0])}: the offsets start at 0")
    falls = np.nonzero(a[1:] < a[:-1])[0]
    if falls.size:
        i = int(falls[0]) + 1
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{name}[{i}] = {int(a[i])} is below {name}[{i - 1}] = "
                            f"{int(a[i - 1])}: the offsets must be non-decreasing")
    if int(a[-1]) != total:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{name}[{a.shape[0] - 1}] = {int(a[-1])} but there are {total} "
                            f"rows: the offsets end at the total")
    return np.ascontiguousarray(a, dtype=np.int32)


def _window(window_size) -> tuple:
    """flash-attn's window_size (left, right) as two ints (-1: unbounded on that side)."""
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"window_size={window_size!r}: expected (left, right) integers, -1 "
                            f"for unbounded") from None
    return left, right


def _scale_alias(softmax_scale, scale):
    """flash-attn's softmax_scale, or clattn's older scale= keyword (not both)."""
    if softmax_scale is not None and scale is not None:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "softmax_scale and scale are the same argument: give one")
    return scale if softmax_scale is None else softmax_scale


def _flash_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                   scale, window_size, softcap, alibi_slopes, sinks, drop, ctx,
                   entry: str = "varlen_attention") -> SimpleNamespace:
    """The checked arguments of a FlashAttention-style call on numpy arrays, as the C plan
    takes them. Packed (cu_seqlens given): q (total_q, Hq, E), k (total_k, Hkv, E), v (total_k,
    Hkv, Ev). Batched (cu_seqlens_q None): q (B, Lq, Hq, E), k (B, Lk, Hkv, E), v (B, Lk,
    Hkv, Ev) bound as the (B, H, L, E) views of that memory (no transpose copy). causal and
    the window bottom-right aligned per sequence, as FlashAttention's. drop: (p, seed, offset)
    or None (the batched form only: the C library has no dropout with cu_seqlens)."""
    packed = cu_seqlens_q is not None
    q_dtype = np.asarray(q).dtype
    qa, ka, va = (_as_float(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    rank = 3 if packed else 4
    if qa.ndim != rank or ka.ndim != rank or va.ndim != rank or 0 in qa.shape or \
            0 in ka.shape or 0 in va.shape or va.shape[:-1] != ka.shape[:-1] or \
            ka.shape[-1] != qa.shape[-1] or qa.shape[-2] % ka.shape[-2] or \
            (not packed and qa.shape[0] != ka.shape[0]):
        want = ("(total_q, Hq, E), (total_k, Hkv, E), (total_k, Hkv, Ev)" if packed else
                "(B, Lq, Hq, E), (B, Lk, Hkv, E), (B, Lk, Hkv, Ev)")
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"{entry}: q {qa.shape}, k {ka.shape}, v {va.shape}: expected {want}, "
                            f"Hkv dividing Hq, no dimension 0")
    Hq = qa.shape[-2]
    if packed:
        cq = _offsets("cu_seqlens_q", cu_seqlens_q, qa.shape[0], None)
        ck = _offsets("cu_seqlens_k", cu_seqlens_k, ka.shape[0], cq.shape[0])
        B = cq.shape[0] - 1
        longest = (max(1, int(np.max(np.diff(cq)))), max(1, int(np.max(np.diff(ck)))))
        totals = (qa.shape[0], ka.shape[0])
    else:
        cq = ck = None
        B = qa.shape[0]
        longest = totals = (qa.shape[1], ka.shape[1])
    given = (max_seqlen_q, max_seqlen_k)
    for name, m, need in (("max_seqlen_q", given[0], longest[0]),
                          ("max_seqlen_k", given[1], longest[1])):
        if m is not None and int(m) < need:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name}={m}: the longest sequence has {need} rows")
    # an upper bound past the total (flash-attn takes any bound) is the total
    max_q = min(int(given[0]), totals[0]) if given[0] is not None and packed else longest[0]
    max_k = min(int(given[1]), totals[1]) if given[1] is not None and packed else longest[1]
    if scale is not None and not math.isfinite(scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")
    if not math.isfinite(float(softcap)) or float(softcap) < 0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"softcap={softcap}: expected a finite value >= 0 (0: off)")
    left, right = _window(window_size)
    extras = {}
    if sinks is not None:
        extras["sinks"] = _sinks_array(sinks, Hq)
    if alibi_slopes is not None:
        extras["alibi_slopes"] = np.ascontiguousarray(np.asarray(alibi_slopes, dtype=np.float32))
        if extras["alibi_slopes"].shape not in ((Hq,), (B, Hq)):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"alibi_slopes has shape {np.shape(alibi_slopes)}; expected "
                                f"({Hq},) or ({B}, {Hq})")
    qc, kc, vc = (np.ascontiguousarray(a) for a in (qa, ka, va))
    dtypes = tuple(clattn_dtype(a.dtype) for a in (qc, kc, vc))
    if packed:
        lse_shape = (Hq, qc.shape[0])
    else:
        lse_shape = (B, Hq, qc.shape[1])
    return SimpleNamespace(packed=packed, q_dtype=q_dtype, qc=qc, kc=kc, vc=vc, cq=cq, ck=ck,
                           B=B, Hq=Hq, max_q=max_q, max_k=max_k, causal=bool(causal),
                           scale=scale, softcap=float(softcap), left=left, right=right,
                           extras=extras, dtypes=dtypes, drop=drop, ctx=ctx or default_context(),
                           out_shape=qc.shape[:-1] + (vc.shape[-1],), lse_shape=lse_shape)


def _flash_layout(pb, code, a):
    """A (packed rank 3, or batched (B, L, H, D)) array's clattn layout: batched arrays are
    bound as their (B, H, L, D) view."""
    if pb.packed:
        return layout(code, a.shape)
    B, L, H, D = a.shape
    return layout(code, (B, H, L, D), (L * H * D, D, H * D, 1))


def _flash_desc(pb, tensors: dict):
    """The SDPA descriptor of a FlashAttention-style problem with these role layouts."""
    desc = _lib.SdpaDesc()
    lib.clattn_sdpa_desc_init(ctypes.byref(desc))
    t = desc.tensors
    for name, lay in tensors.items():
        setattr(t, name, lay)
    align = _lib.CAUSAL_BOTTOM_RIGHT
    desc.causal = align if pb.causal else _lib.CAUSAL_NONE
    if pb.left >= 0 or pb.right >= 0:
        desc.window_align, desc.window_left, desc.window_right = align, pb.left, pb.right
    desc.scale = float("nan") if pb.scale is None else float(pb.scale)
    desc.softcap = pb.softcap
    if pb.packed:
        desc.max_seqlen_q, desc.max_seqlen_k = pb.max_q, pb.max_k
    desc.path = _lib.PATH_FUSED
    _set_dropout(desc, pb.drop)
    return desc


def _flash_key(pb, kind: str, arrays: dict) -> tuple:
    return (kind, pb.packed, tuple((n, c, a.shape) for n, (c, a) in arrays.items()),
            pb.max_q, pb.max_k, pb.causal, pb.scale, pb.left, pb.right, pb.softcap, pb.drop)


def _flash_execute(pb, kind: str, inputs: dict, outputs: dict, create_plan) -> None:
    """Upload `inputs` (role -> (clattn dtype, array)), run the plan (cached per layout; a
    dropout plan per call) and read `outputs` (role -> (clattn dtype, array)) back in place."""
    ctx = pb.ctx

    def tensors():
        src = {}
        for name, (code, a) in list(inputs.items()) + list(outputs.items()):
            if name in ("cu_seqlens_q", "cu_seqlens_k", "sinks", "alibi_slopes", "lse",
                        "grad_sinks"):
                src[name] = layout(code, a.shape)
            else:
                src[name] = _flash_layout(pb, code, a)
        return src

    def create():
        return create_plan(_flash_desc(pb, tensors()))

    key_ = _flash_key(pb, kind, {**inputs, **outputs})
    with ctx.lock, _plan_for(ctx, key_, create, pb.drop) as plan:
        t = _lib.Tensors()
        buffers = {}
        for name, lay in tensors().items():
            setattr(t, name, lay)
        for name, (_, a) in inputs.items():
            buffers[name] = Buffer(ctx, a)
            getattr(t, name).mem = buffers[name].mem
        for name, (_, a) in outputs.items():
            buffers[name] = Buffer(ctx, nbytes=a.nbytes)
            getattr(t, name).mem = buffers[name].mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(t), _lib.ROLE_COUNT, None, None, 0,
                                          None, None))
        for name, (_, a) in outputs.items():
            buffers[name].read(ctx, a)


def _flash_inputs(pb) -> dict:
    inputs = {"q": (pb.dtypes[0], pb.qc), "k": (pb.dtypes[1], pb.kc),
              "v": (pb.dtypes[2], pb.vc)}
    if pb.packed:
        inputs["cu_seqlens_q"] = (_lib.I32, pb.cq)
        inputs["cu_seqlens_k"] = (_lib.I32, pb.ck)
    for name, a in pb.extras.items():
        inputs[name] = (_lib.F32, a)
    return inputs


def _flash_forward(pb, want_lse: bool):
    """(out, lse): out of q's shape but Ev and of q's dtype (float64 in, float64 out); lse
    float32 (Hq, total_q) packed or (B, Hq, Lq) batched, None unless want_lse."""
    out = np.empty(pb.out_shape, dtype=pb.qc.dtype)
    outputs = {"out": (pb.dtypes[0], out)}
    lse = None
    if want_lse:
        lse = np.empty(pb.lse_shape, np.float32)
        outputs["lse"] = (_lib.F32, lse)
    _flash_execute(pb, "flash-fwd", _flash_inputs(pb), outputs,
                   lambda desc: _sdpa_plan(pb.ctx, desc))
    if pb.q_dtype == np.float64:
        out = out.astype(np.float64)
    return out, lse


def _flash_backward(pb, out, lse, grad_out) -> tuple:
    """clattn's backward (clattn_sdpa_backward_plan_create) of the problem pb whose forward
    gave out and lse: (dq, dk, dv, dsinks) as float32 arrays of q's, k's, v's shapes (dsinks
    (Hq,) or None)."""
    oc = np.ascontiguousarray(_as_float("out", out))
    dc = np.ascontiguousarray(_as_float("grad_out", grad_out))
    if oc.shape != pb.out_shape or dc.shape != pb.out_shape:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"out {oc.shape} and grad_out {dc.shape}: the forward's is "
                            f"{pb.out_shape}")
    inputs = _flash_inputs(pb)
    inputs["out"] = (clattn_dtype(oc.dtype), oc)
    inputs["grad_out"] = (clattn_dtype(dc.dtype), dc)
    inputs["lse"] = (_lib.F32, np.ascontiguousarray(lse, dtype=np.float32))
    grads = {"grad_q": (_lib.F32, np.empty(pb.qc.shape, np.float32)),
             "grad_k": (_lib.F32, np.empty(pb.kc.shape, np.float32)),
             "grad_v": (_lib.F32, np.empty(pb.vc.shape, np.float32))}
    if "sinks" in pb.extras:
        grads["grad_sinks"] = (_lib.F32, np.empty(pb.extras["sinks"].shape, np.float32))

    def create(desc):
        plan = ctypes.c_void_p()
        pb.ctx.check(lib.clattn_sdpa_backward_plan_create(pb.ctx.handle, ctypes.byref(desc),
                                                          ctypes.byref(plan)))
        return plan

    _flash_execute(pb, "flash-bwd", inputs, grads, create)
    return (grads["grad_q"][1], grads["grad_k"][1], grads["grad_v"][1],
            grads["grad_sinks"][1] if "grad_sinks" in grads else None)


def _varlen_dropout(dropout_p, entry: str = "varlen_attention") -> None:
    """Packed sequences have no dropout in the C library: refuse dropout_p > 0 clearly."""
    p = _probability(dropout_p)
    if p > 0.0:
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"{entry}: dropout_p={p}: clattn has no dropout on packed "
                            f"variable-length batches (cu_seqlens); pad the batch and use "
                            f"clattn.flash_attn.flash_attn_func or scaled_dot_product_attention "
                            f"with dropout_p, or pass dropout_p=0 (evaluation)")
