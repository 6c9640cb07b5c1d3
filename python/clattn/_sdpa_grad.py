"""SDPA for training on numpy arrays: :func:`sdpa_forward` (the output and the rows'
log-sum-exp) and :func:`sdpa_backward` (clattn's backward, :class:`SdpaGrads`), with the
private forms clattn.flex and the autograd modules call (user score functions, _flex)."""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

from . import _lib, _torch
from ._common import _as_float, _fill, _plan_for, _score, _sdpa_plan
from ._core import ArgumentError, ArrayLike, Buffer, Context, clattn_dtype, default_context, layout
from ._lib import lib
from ._sdpa import _packed, _problem, _strides_of
from .dropout import _dropout_args


def _sum_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    """g summed over the dims that broadcasting `shape` to g's shape added or repeated (the
    gradient of a broadcast input)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    elif lead < 0:  # fewer dims than the input: the input's extra leading dims are ones
        g = g.reshape((1,) * -lead + g.shape)
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, g.shape)) if n == 1 and m != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


@_torch.torch_io("sdpa_forward")
def sdpa_forward(query: ArrayLike, key: ArrayLike, value: ArrayLike,
                 attn_mask: Optional[ArrayLike] = None, is_causal: bool = False,
                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                 sinks: Optional[ArrayLike] = None, ctx: Optional[Context] = None,
                 path: str = "auto", dropout_p: float = 0.0,
                 dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                 softcap: float = 0.0, window_size=(-1, -1)):
    """``scaled_dot_product_attention`` on numpy arrays that also returns the rows'
    log-sum-exp, what :func:`sdpa_backward` takes: ``(out, lse)``.

    The arguments are scaled_dot_product_attention's (numpy in, numpy out; torch tensors in,
    torch tensors out, and TypeError on tensors that require grad: autograd is
    scaled_dot_product_attention's). Dropout (keyword only): dropout_p with an explicit
    dropout_seed (an integer in [0, 2^64); required when dropout_p > 0, nothing is drawn
    here) and dropout_offset, as scaled_dot_product_attention takes them; give
    :func:`sdpa_backward` the same three. out is (..., Hq, L, Ev) in query's dtype (the
    dropped weights' output); lse is float32 (..., Hq, L): the log-sum-exp of each row's
    masked, scaled scores (the sink included; undropped), -inf for a row whose keys are all
    masked."""
    return _sdpa_forward(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                         sinks=sinks, ctx=ctx, path=path, dropout_p=dropout_p,
                         dropout_seed=dropout_seed, dropout_offset=dropout_offset,
                         softcap=softcap, window_size=window_size)


def _sdpa_forward(query, key, value, attn_mask=None, is_causal=False, scale=None,
                  enable_gqa=False, *, sinks=None, ctx=None, path="auto", dropout_p=0.0,
                  dropout_seed=None, dropout_offset=0, softcap=0.0, window_size=(-1, -1),
                  _flex=None):
    """sdpa_forward on numpy arrays; _flex: clattn.flex's user score functions and their
    tensors (clattn.flex_attention)."""
    query, key, value, attn_mask, sinks = (_torch.to_numpy(a) for a in
                                           (query, key, value, attn_mask, sinks))
    sc = _score(attn_mask, is_causal, scale, softcap, window_size, path)
    drop = _dropout_args(dropout_p, dropout_seed, dropout_offset, entry="sdpa_forward")
    ctx = ctx or default_context()
    pb = _problem(query, key, value, attn_mask, enable_gqa, sinks)
    (qc, qs), (kc, ks), (vc, vs) = _packed(pb.q4), _packed(pb.k4), _packed(pb.v4)
    B, H, L, Ev, dtypes = pb.B, pb.heads_q, pb.L, pb.Ev, pb.dtypes
    out = np.empty((B, H, L, Ev), dtype=pb.q4.dtype)
    lse = np.empty((B, H, L), dtype=np.float32)

    def tensors():
        t = _lib.Tensors()
        t.q = layout(dtypes[0], pb.q4.shape, qs)
        t.k = layout(dtypes[1], pb.k4.shape, ks)
        t.v = layout(dtypes[2], pb.v4.shape, vs)
        t.out = layout(dtypes[0], out.shape)
        t.lse = layout(_lib.F32, lse.shape)
        if pb.mask4 is not None:
            t.attn_mask = layout(pb.mask4[1], pb.mask4[0].shape)
        if pb.sinks1 is not None:
            t.sinks = layout(_lib.F32, pb.sinks1.shape)
        for name, (code, a) in flex_inputs.items():
            setattr(t, name, layout(code, a.shape))
        return t

    flex_inputs = {} if _flex is None else _flex.inputs()
    key_ = ("sdpa-lse", pb.q4.shape, pb.k4.shape, pb.v4.shape, dtypes, qs, ks, vs,
            None if pb.mask4 is None else (pb.mask4[0].shape, pb.mask4[1]), sc,
            pb.sinks1 is not None, drop, None if _flex is None else _flex.key)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        src, t = tensors(), desc.tensors
        for name in ("q", "k", "v", "out", "lse", "attn_mask", "sinks", *flex_inputs):
            setattr(t, name, getattr(src, name))
        _fill(desc, sc, drop)
        if _flex is not None:
            _flex.fill(desc)
        return _sdpa_plan(ctx, desc)

    with ctx.lock, _plan_for(ctx, key_, create, drop) as plan:
        t = tensors()
        inputs = [("q", qc), ("k", kc), ("v", vc)]
        if pb.mask4 is not None:
            inputs.append(("attn_mask", pb.mask4[0]))
        if pb.sinks1 is not None:
            inputs.append(("sinks", pb.sinks1))
        inputs += [(name, a) for name, (_, a) in flex_inputs.items()]
        buffers = []
        for name, a in inputs:
            buffers.append(Buffer(ctx, a))
            getattr(t, name).mem = buffers[-1].mem
        out_buf, lse_buf = Buffer(ctx, nbytes=out.nbytes), Buffer(ctx, nbytes=lse.nbytes)
        t.out.mem, t.lse.mem = out_buf.mem, lse_buf.mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(t), _lib.ROLE_COUNT, None, None, 0,
                                          None, None))
        out_buf.read(ctx, out)
        lse_buf.read(ctx, lse)
        if _flex is not None:
            _flex.executed(ctx, plan)
    result = out.reshape(pb.result_shape)
    if pb.q_in.dtype == np.float64:
        result = result.astype(np.float64)
    return result, lse.reshape(pb.result_shape[:-1])


class SdpaGrads(tuple):
    """What :func:`sdpa_backward` returns: the tuple ``(grad_query, grad_key, grad_value)``
    (so ``dq, dk, dv = sdpa_backward(...)`` works), with the optional gradients as
    attributes: ``grad_attn_mask`` (with want_mask_grad, else None) and ``grad_sinks`` (when
    sinks were given, else None)."""

    def __new__(cls, grad_query, grad_key, grad_value, grad_attn_mask=None, grad_sinks=None):
        self = super().__new__(cls, (grad_query, grad_key, grad_value))
        self.grad_attn_mask = grad_attn_mask
        self.grad_sinks = grad_sinks
        return self

    def _map(self, f) -> "SdpaGrads":
        """The same gradients, each passed through f (None stays None)."""
        return SdpaGrads(*(None if g is None else f(g) for g in
                           (*self, self.grad_attn_mask, self.grad_sinks)))

    grad_query = property(lambda self: self[0])
    grad_key = property(lambda self: self[1])
    grad_value = property(lambda self: self[2])


@_torch.torch_io("sdpa_backward")
def sdpa_backward(query: ArrayLike, key: ArrayLike, value: ArrayLike, out: ArrayLike,
                  lse: Optional[ArrayLike], grad_out: ArrayLike,
                  attn_mask: Optional[ArrayLike] = None, is_causal: bool = False,
                  scale: Optional[float] = None, enable_gqa: bool = False, *,
                  sinks: Optional[ArrayLike] = None, ctx: Optional[Context] = None,
                  want_mask_grad: bool = False, dropout_p: float = 0.0,
                  dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                  path: str = "auto", softcap: float = 0.0,
                  window_size=(-1, -1)) -> SdpaGrads:
    """The backward pass of ``scaled_dot_product_attention`` on the clattn device
    (clattn_sdpa_backward_plan_create: FlashAttention-2's recomputation from the lse, memory
    linear in the sequence), on numpy arrays.

    query, key, value, attn_mask, is_causal, scale, enable_gqa, sinks, softcap, window_size,
    and dropout_p, dropout_seed, dropout_offset (keyword only; the seed is required when
    dropout_p > 0):
    exactly what the forward got (same shapes and meanings; rank 2 to 4 and broadcast batch
    dims as there); the dropout mask is regenerated from them, never stored.
    out and lse: the forward's results, as :func:`sdpa_forward` returns them (out
    (..., Hq, L, Ev), lse float32 (..., Hq, L)). grad_out: dL/d out, out's shape, any float
    dtype. want_mask_grad: also the gradient of a float attn_mask (of the mask's own shape,
    summed over the dims it was broadcast along); a bool mask has none (ArgumentError).
    Computed in float32. Returns :class:`SdpaGrads`: the tuple (grad_query, grad_key,
    grad_value), each of its input's shape and dtype (float64 inputs give float64; with
    grouped heads grad_key and grad_value sum each group's query heads), with attributes
    ``grad_attn_mask`` (with want_mask_grad, else None) and ``grad_sinks`` (float32 (Hq,),
    when sinks are given, else None). torch tensors in give torch tensors out; tensors that
    require grad are refused (TypeError): autograd is ``scaled_dot_product_attention``'s.
    path (keyword only): "auto" (fused with lse, else unfused), "fused", or "unfused": the
    reference backward over whole (Lq, Lk) score matrices, the weights recomputed by the
    forward's softmax; lse may then be None (but with sinks, whose gradient needs it)."""
    return _sdpa_backward(query, key, value, out, lse, grad_out, attn_mask, is_causal, scale,
                          enable_gqa, sinks=sinks, ctx=ctx, want_mask_grad=want_mask_grad,
                          dropout_p=dropout_p, dropout_seed=dropout_seed,
                          dropout_offset=dropout_offset, path=path, softcap=softcap,
                          window_size=window_size)


def _sdpa_backward(query, key, value, out, lse, grad_out, attn_mask=None, is_causal=False,
                   scale=None, enable_gqa=False, *, sinks=None, ctx=None,
                   want_mask_grad=False, dropout_p=0.0, dropout_seed=None, dropout_offset=0,
                   path="auto", softcap=0.0, window_size=(-1, -1), _flex=None) -> SdpaGrads:
    """sdpa_backward on numpy arrays; _flex: clattn.flex's user score functions and their
    tensors (clattn.flex_attention)."""
    query, key, value, out, lse, grad_out, attn_mask, sinks = (
        _torch.to_numpy(a) for a in (query, key, value, out, lse, grad_out, attn_mask, sinks))
    sc = _score(attn_mask, is_causal, scale, softcap, window_size, path)
    drop = _dropout_args(dropout_p, dropout_seed, dropout_offset, entry="sdpa_backward")
    ctx = ctx or default_context()
    pb = _problem(query, key, value, attn_mask, enable_gqa, sinks)
    B, H, L, Ev, dtypes = pb.B, pb.heads_q, pb.L, pb.Ev, pb.dtypes
    if want_mask_grad and (pb.mask4 is None or pb.mask4[1] == _lib.U8):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "want_mask_grad=True needs a float attn_mask (a bool mask has no "
                            "gradient)")
    out_shape, lse_shape = tuple(pb.result_shape), tuple(pb.result_shape[:-1])
    out_a, dout_a = _as_float("out", out), _as_float("grad_out", grad_out)
    lse_a = None if lse is None else np.asarray(lse)
    for name, a, want in (("out", out_a, out_shape), ("grad_out", dout_a, out_shape),
                          ("lse", lse_a, lse_shape)):
        if a is not None and tuple(a.shape) != want:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"{name} has shape {tuple(a.shape)}; the forward's is {want}")
    # The gradients are per batch: every input is uploaded whole (no stride-0 batch).
    qc, kc, vc = (np.ascontiguousarray(a) for a in (pb.q4, pb.k4, pb.v4))
    oc = np.ascontiguousarray(out_a).reshape((B, H, L, Ev))
    dc = np.ascontiguousarray(dout_a).reshape((B, H, L, Ev))
    lc = None if lse_a is None else np.ascontiguousarray(lse_a, dtype=np.float32).reshape(
        (B, H, L))
    grads = {"grad_q": np.empty(qc.shape, np.float32), "grad_k": np.empty(kc.shape, np.float32),
             "grad_v": np.empty(vc.shape, np.float32)}
    if want_mask_grad:
        grads["grad_attn_mask"] = np.empty(pb.mask4[0].shape, np.float32)
    if pb.sinks1 is not None:
        grads["grad_sinks"] = np.empty(pb.sinks1.shape, np.float32)
    inputs = {"q": (dtypes[0], qc), "k": (dtypes[1], kc), "v": (dtypes[2], vc),
              "out": (clattn_dtype(oc.dtype), oc), "grad_out": (clattn_dtype(dc.dtype), dc)}
    if lc is not None:
        inputs["lse"] = (_lib.F32, lc)
    if pb.mask4 is not None:
        inputs["attn_mask"] = (pb.mask4[1], pb.mask4[0])
    if pb.sinks1 is not None:
        inputs["sinks"] = (_lib.F32, pb.sinks1)
    if _flex is not None:
        inputs.update(_flex.inputs())

    def tensors():
        t = _lib.Tensors()
        for name, (code, a) in inputs.items():
            setattr(t, name, layout(code, a.shape, _strides_of(a)))
        for name, a in grads.items():
            setattr(t, name, layout(_lib.F32, a.shape))
        return t

    key_ = ("sdpa-backward", sc,
            tuple((n, c, a.shape, _strides_of(a)) for n, (c, a) in inputs.items()),
            tuple((n, a.shape) for n, a in grads.items()), drop,
            None if _flex is None else _flex.key)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        src, t = tensors(), desc.tensors
        for name in tuple(inputs) + tuple(grads):
            setattr(t, name, getattr(src, name))
        _fill(desc, sc, drop)
        if _flex is not None:
            _flex.fill(desc)
        plan = ctypes.c_void_p()
        ctx.check(lib.clattn_sdpa_backward_plan_create(ctx.handle, ctypes.byref(desc),
                                                       ctypes.byref(plan)))
        return plan

    with ctx.lock, _plan_for(ctx, key_, create, drop) as plan:
        t = tensors()
        buffers = {}
        for name, (_, a) in inputs.items():
            buffers[name] = Buffer(ctx, a)
            getattr(t, name).mem = buffers[name].mem
        for name, a in grads.items():
            buffers[name] = Buffer(ctx, nbytes=a.nbytes)
            getattr(t, name).mem = buffers[name].mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(t), _lib.ROLE_COUNT, None, None, 0,
                                          None, None))
        for name, a in grads.items():
            buffers[name].read(ctx, a)

    def back(g, given, name):
        """A rank-4 gradient as its input's shape and dtype (summed over broadcast dims)."""
        a = np.asarray(given)
        full = pb.batch + g.shape[1:] if len(pb.batch) != 1 else g.shape
        g = _sum_to(g.reshape(full), a.shape)
        dtype = a.dtype if a.dtype == np.float64 else _as_float(name, a).dtype
        return g.astype(dtype, copy=False)

    dq = back(grads["grad_q"], query, "query")
    dk = back(grads["grad_k"], key, "key")
    dv = back(grads["grad_v"], value, "value")
    dmask = None
    if want_mask_grad:
        m = np.asarray(attn_mask)
        g = grads["grad_attn_mask"]
        if g.shape != m.shape:  # broadcast here to (B, H, L, S) (see _problem)
            g = _sum_to(g.reshape(pb.batch + g.shape[1:]), m.shape)
        dmask = g.astype(m.dtype if m.dtype == np.float64 else _as_float("attn_mask", m).dtype,
                         copy=False)
    return SdpaGrads(dq, dk, dv, dmask, grads.get("grad_sinks"))
