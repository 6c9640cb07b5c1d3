"""clattn.scaled_dot_product_attention with PyTorch's argument meanings, on numpy arrays."""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import warnings
from types import SimpleNamespace
from typing import NamedTuple, Optional

import numpy as np

from . import _lib, _torch
from .dropout import _dropout_args
from ._core import (ArgumentError, ArrayLike, Buffer, Context, Prepared, clattn_dtype,
                    default_context, layout)
from ._lib import lib

_PATHS = {"auto": _lib.PATH_AUTO, "fused": _lib.PATH_FUSED, "unfused": _lib.PATH_UNFUSED}


def _sinks_array(sinks, heads: int) -> Optional[np.ndarray]:
    """Attention sinks as float32 (heads,): finite logits or -inf (no sink); None stays None."""
    if sinks is None:
        return None
    a = np.ascontiguousarray(np.asarray(sinks, dtype=np.float32))
    if a.shape != (heads,):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"sinks has shape {np.shape(sinks)}; expected ({heads},): one logit "
                            f"per query head")
    if np.isnan(a).any() or (a == np.inf).any():
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "sinks: every sink must be a finite logit or -inf (no sink)")
    return a


_warned_float64 = False


def _warn_float64() -> None:
    """Says once per process that float64 inputs are computed in float32 (clattn's kernels
    store f32, f16 and bf16 and compute in float32; the results come back as float64)."""
    global _warned_float64
    if not _warned_float64:
        _warned_float64 = True
        here, level, frame = __file__.rsplit("/", 1)[0], 2, sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(here):
            frame, level = frame.f_back, level + 1  # point at the caller's line
        warnings.warn("clattn computes float64 inputs in float32 (about 1e-7 relative error) "
                      "and returns float64; said once per process", RuntimeWarning,
                      stacklevel=level)


def _as_float(name: str, array) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype == np.float64:
        _warn_float64()
        return a.astype(np.float32)
    try:
        clattn_dtype(a.dtype)
    except TypeError:
        raise TypeError(f"clattn: {name} has dtype {a.dtype}; expected float32, float16, "
                        f"bfloat16 (ml_dtypes) or float64") from None
    return a


def _to_rank4(name: str, a: np.ndarray, batch: tuple) -> np.ndarray:
    """(..., H, L, E) with leading dims broadcast to `batch`, as (B, H, L, E); a stride-0
    batch is kept as such (no copy) where the leading dims are one."""
    if a.ndim < 2:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"{name} has {a.ndim} dims; expected (..., L, E)")
    if a.ndim == 2:
        a = a[None]
    target = tuple(batch) + a.shape[-3:]
    try:
        a = np.broadcast_to(a, target)
    except ValueError:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"{name} has shape {a.shape}, whose batch dims do not broadcast "
                            f"to {tuple(batch)}") from None
    b = int(np.prod(batch)) if batch else 1
    if len(batch) == 1:
        return a
    return np.ascontiguousarray(a).reshape((b,) + a.shape[-3:])


def scaled_dot_product_attention(query: ArrayLike, key: ArrayLike, value: ArrayLike,
                                 attn_mask: Optional[ArrayLike] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *, ctx: Optional[Context] = None,
                                 path: str = "auto", sinks: Optional[ArrayLike] = None,
                                 softcap: float = 0.0, window_size=(-1, -1),
                                 need_weights: bool = False,
                                 dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                                 generator=None) -> ArrayLike:
    """Attention as ``torch.nn.functional.scaled_dot_product_attention`` computes it, on the
    clattn device.

    query (..., Hq, L, E), key (..., H, S, E), value (..., H, S, Ev): numpy arrays of float32,
    float16, bfloat16 (``ml_dtypes.bfloat16``) or float64 (computed in float32); the leading
    dims broadcast. Rank 2 and 3 work as in PyTorch ((L, E), (N, L, E)).
    attn_mask: broadcastable to (..., L, S); bool (True = the key takes part) or float (added
    to the scaled scores; -inf masks). is_causal: query i sees keys j <= i (top-left); not
    together with attn_mask. scale: None for 1/sqrt(E). enable_gqa: key and value may have
    fewer heads H, a divisor of Hq (query head h attends with head h // (Hq // H)).
    pyopencl arrays (``pyopencl.array.Array``, rank 2 to 4, float32 or float16, any strides)
    are read where they lie and the result is a pyopencl array on the same queue, enqueued
    there (no host round trip); the context is then ``Context.from_pyopencl(query.queue)``
    (made once per queue) unless ctx is given.
    The positional order is torch's: (query, key, value, attn_mask, dropout_p, is_causal,
    scale, enable_gqa).
    dropout_p: attention dropout as torch's (applied whenever dropout_p > 0, as torch's
    function does; modules pass 0 in eval mode): after the softmax each weight is kept with
    probability 1 - dropout_p and scaled by 1 / (1 - dropout_p), or zeroed (1 zeroes them
    all). Which are kept is a pure function of (dropout_seed, dropout_offset, batch, head,
    row, key) (:func:`clattn.dropout_mask` computes it on the host; every device draws the
    same). dropout_seed (keyword only): an integer in [0, 2^64); None (the default) draws one
    from torch's random numbers for torch tensors (``generator``, a torch.Generator, else
    torch's default CPU generator: one ``torch.randint`` per call, so ``torch.manual_seed``
    repeats runs); numpy and pyopencl inputs need it given (or a generator). dropout_offset
    (keyword only): the first Philox stream (weight (b, h) uses dropout_offset + b * Hq + h;
    advancing it by batch * Hq gives a fresh mask under one seed). With autograd the forward
    keeps (seed, offset), not the mask, and the backward regenerates it. Both are ignored
    when dropout_p is 0.
    torch tensors in give a torch tensor out, of the query's dtype and on its device (CPU
    tensors are read in place through numpy views and the result wraps clattn's output
    without a copy); numpy in gives numpy out. Where torch records gradients
    (torch.is_grad_enabled()) and query, key, value, a float attn_mask or sinks requires
    grad, the call is a ``torch.autograd.Function`` (clattn.autograd): backward() runs
    clattn's backward (:func:`sdpa_backward`) and gives those tensors their gradients.
    ctx, path (keyword only): the clattn.Context (None: the default one); "auto" (the fused
    kernel where it applies), "fused" or "unfused".
    sinks (keyword only): attention sinks (GPT-OSS), one logit per query head, shape (Hq,):
    head h's sink joins each row's softmax denominator and takes no value,
    p_ij = exp(s_ij - m) / (sum_j exp(s_ij - m) + exp(sinks[h] - m)); -inf is no sink. With
    every mask, causal masking and grouped heads (numpy and torch inputs).
    softcap (keyword only): C > 0 caps each scaled score s to C * tanh(s / C) before the masks
    (Gemma 2, Grok); 0 is off. window_size (keyword only): (left, right), query i sees keys
    i - left .. i + right (-1: unbounded; top-left aligned, as is_causal), a sliding window
    (Mistral, Gemma) without a mask.
    need_weights (keyword only): also return the attention weights, ``(out, weights)``,
    weights (..., Hq, L, S) in query's dtype (softmax(scores), the sink's share left out,
    after dropout, as torch's nn.MultiheadAttention returns them), computed by the unfused
    path (path "fused" is then refused). With autograd both results are differentiable: the
    weights' own gradient is computed in torch from the weights (softmax, masks, sinks,
    GQA; with softcap or dropout that gradient raises NotImplementedError).
    float64 inputs are computed in float32 (the kernels' arithmetic), returned as float64,
    with one RuntimeWarning per process saying so.
    Repeated calls with the same shapes, strides, dtypes and options reuse the plan made by
    the first (and, for numpy, its device buffers): a call then costs the copies, the launch
    and a few microseconds of Python (bench/python_overhead.py).
    Returns (..., Hq, L, Ev) in query's dtype. Raises clattn.ArgumentError (a ValueError) for
    bad shapes or options, TypeError for unsupported dtypes, clattn.DeviceError for device
    failures; a row whose keys are all masked gives zeros (PyTorch gives NaN)."""
    if _torch.compiling():  # torch.compile: the custom operator, traced without a break
        if need_weights:
            raise ArgumentError(_lib.ERR_UNSUPPORTED, "need_weights=True under torch.compile: "
                                "the weights output is not an operator; call it eagerly")
        from .ops import sdpa
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                    sinks=sinks, softcap=softcap, window_size=window_size, path=path)
    if not isinstance(dropout_p, (int, float, np.integer, np.floating)) or \
            isinstance(dropout_p, (bool, np.bool_)) or not 0.0 <= float(dropout_p) <= 1.0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"dropout_p={dropout_p!r}: expected a probability in [0, 1] (the "
                            f"5th positional argument, as in torch; is_causal is the 6th)")
    like = _torch.any_tensor(query, key, value)
    drop = _dropout_args(dropout_p, dropout_seed, dropout_offset,
                         torch_inputs=like is not None, generator=generator)
    p, seed, offset = drop if drop is not None else (0.0, None, 0)
    sc = _score(attn_mask, is_causal, scale, softcap, window_size, path)
    if need_weights and sc.path == _lib.PATH_FUSED:
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            "need_weights=True: the weights come from the unfused path; "
                            "path='fused' never forms them")
    if like is not None and _needs_grad(query, key, value, attn_mask, sinks):
        from .autograd import sdpa_autograd  # torch autograd: the forward keeps its lse
        return sdpa_autograd(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                             sinks=sinks, ctx=ctx, path=path, dropout_p=p, dropout_seed=seed,
                             dropout_offset=offset, softcap=softcap, window_size=window_size,
                             need_weights=need_weights)
    if like is not None:  # torch in, torch out: numpy views of the tensors' memory
        result = scaled_dot_product_attention(
            _torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
            _torch.to_numpy(attn_mask), p, is_causal, scale, enable_gqa, ctx=ctx, path=path,
            sinks=_torch.to_numpy(sinks), softcap=softcap, window_size=window_size,
            need_weights=need_weights, dropout_seed=seed, dropout_offset=offset)
        if need_weights:
            return _torch.from_numpy(result[0], like), _torch.from_numpy(result[1], like)
        return _torch.from_numpy(result, like)
    if _torch.is_tensor(attn_mask):
        attn_mask = _torch.to_numpy(attn_mask)
    if _torch.is_tensor(sinks):
        sinks = _torch.to_numpy(sinks)
    if _is_pyopencl(query) or _is_pyopencl(key) or _is_pyopencl(value):
        if need_weights:
            raise ArgumentError(_lib.ERR_UNSUPPORTED,
                                "need_weights=True takes numpy arrays or torch tensors, not "
                                "pyopencl arrays")
        return _sdpa_pyopencl(query, key, value, attn_mask, enable_gqa, ctx, sc, sinks, drop)
    ctx = ctx or default_context()
    plain = sc.softcap == 0 and sc.left < 0 and sc.right < 0 and not need_weights
    fast_key = None if sinks is not None or drop is not None or not plain else _numpy_key(
        query, key, value, attn_mask, is_causal, scale, enable_gqa, path)
    if fast_key is not None:
        with ctx.lock:
            prepared = ctx.lookup(fast_key)
            if prepared is not None:  # the same shapes as an earlier call: copies and a launch
                arrays = (query, key, value) if attn_mask is None else (query, key, value,
                                                                        attn_mask)
                return prepared.run(ctx, arrays).reshape(prepared.result_shape)
    pb = _problem(query, key, value, attn_mask, enable_gqa, sinks)
    q_in, q4, k4, v4, mask4, sinks1 = pb.q_in, pb.q4, pb.k4, pb.v4, pb.mask4, pb.sinks1
    B, heads_q, L, Ev, dtypes, result_shape = (pb.B, pb.heads_q, pb.L, pb.Ev, pb.dtypes,
                                                pb.result_shape)
    out_dtype = dtypes[0]
    (qc, qs), (kc, ks), (vc, vs) = _packed(q4), _packed(k4), _packed(v4)
    S = pb.S
    weights = np.empty((B, heads_q, L, S), np.float32) if need_weights else None
    key_ = ("sdpa", q4.shape, k4.shape, v4.shape, dtypes, qs, ks, vs,
            None if mask4 is None else (mask4[0].shape, mask4[1]), sc, sinks1 is not None,
            drop, need_weights)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        t = desc.tensors
        t.q = layout(dtypes[0], q4.shape, qs)
        t.k = layout(dtypes[1], k4.shape, ks)
        t.v = layout(dtypes[2], v4.shape, vs)
        t.out = layout(out_dtype, (B, heads_q, L, Ev))
        if mask4 is not None:
            t.attn_mask = layout(mask4[1], mask4[0].shape)
        if sinks1 is not None:
            t.sinks = layout(_lib.F32, sinks1.shape)
        if weights is not None:
            t.weights = layout(_lib.F32, weights.shape)
        _fill(desc, sc, drop)
        return _sdpa_plan(ctx, desc)

    raw = [query, key, value] + ([attn_mask] if attn_mask is not None else [])
    uploads = [qc, kc, vc] + ([mask4[0]] if mask4 is not None else [])
    if fast_key is not None and all(
            r.flags.c_contiguous and r.nbytes == u.nbytes and u.nbytes > 0 and
            (r.dtype == u.dtype or (r.dtype == np.bool_ and u.dtype == np.uint8))
            for r, u in zip(raw, uploads)):
        # Later calls of these shapes go straight to Prepared.run (the arrays' bytes are what
        # this call uploads).
        tensors = _lib.Tensors()
        tensors.q = layout(dtypes[0], q4.shape, qs)
        tensors.k = layout(dtypes[1], k4.shape, ks)
        tensors.v = layout(dtypes[2], v4.shape, vs)
        tensors.out = layout(out_dtype, (B, heads_q, L, Ev))
        roles = [("q", qc.nbytes), ("k", kc.nbytes), ("v", vc.nbytes)]
        if mask4 is not None:
            tensors.attn_mask = layout(mask4[1], mask4[0].shape)
            roles.append(("attn_mask", mask4[0].nbytes))
        with ctx.lock:
            plan = ctx.take(key_) or create()
            try:
                prepared = Prepared(ctx, plan, tensors, roles, "out", (B, heads_q, L, Ev),
                                    q4.dtype)
            except BaseException:
                lib.clattn_plan_release(plan)
                raise
            prepared.result_shape = result_shape
            ctx.store(fast_key, prepared)
            return prepared.run(ctx, raw).reshape(result_shape)

    out = np.empty((B, heads_q, L, Ev), dtype=q4.dtype)
    with ctx.lock, _plan_for(ctx, key_, create, drop) as plan:
        buffers = [Buffer(ctx, qc), Buffer(ctx, kc), Buffer(ctx, vc),
                   Buffer(ctx, nbytes=out.nbytes)]
        tensors = _lib.Tensors()
        tensors.q = layout(dtypes[0], q4.shape, qs)
        tensors.k = layout(dtypes[1], k4.shape, ks)
        tensors.v = layout(dtypes[2], v4.shape, vs)
        tensors.out = layout(out_dtype, out.shape)
        tensors.q.mem, tensors.k.mem, tensors.v.mem = (buffers[0].mem, buffers[1].mem,
                                                       buffers[2].mem)
        tensors.out.mem = buffers[3].mem
        if mask4 is not None:
            buffers.append(Buffer(ctx, mask4[0]))
            tensors.attn_mask = layout(mask4[1], mask4[0].shape)
            tensors.attn_mask.mem = buffers[-1].mem
        if sinks1 is not None:
            buffers.append(Buffer(ctx, sinks1))
            tensors.sinks = layout(_lib.F32, sinks1.shape)
            tensors.sinks.mem = buffers[-1].mem
        if weights is not None:
            buffers.append(Buffer(ctx, nbytes=weights.nbytes))
            tensors.weights = layout(_lib.F32, weights.shape)
            tensors.weights.mem = buffers[-1].mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(tensors), _lib.ROLE_COUNT,
                                          None, None, 0, None, None))
        buffers[3].read(ctx, out)
        if weights is not None:
            buffers[-1].read(ctx, weights)
    result = out.reshape(result_shape)
    if q_in.dtype == np.float64:
        result = result.astype(q_in.dtype)
    if weights is None:
        return result
    return result, weights.reshape(result_shape[:-1] + (S,)).astype(result.dtype, copy=False)


def _problem(query, key, value, attn_mask, enable_gqa, sinks) -> SimpleNamespace:
    """The arguments of scaled_dot_product_attention checked and brought to rank 4: q4, k4, v4
    (B, H, L, E) (a broadcast batch may keep stride 0), mask4 (array, clattn dtype) or None,
    sinks1 (float32 (Hq,)) or None, batch (the broadcast leading dims), B, heads_q, L, S, Ev,
    dtypes (of q4, k4, v4), result_shape (the output's shape for these inputs) and q_in."""
    q_in = np.asarray(query)
    q, k, v = _as_float("query", query), _as_float("key", key), _as_float("value", value)
    if not (q.ndim == k.ndim == v.ndim) or q.ndim < 2:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"query, key and value must have the same rank >= 2 (got "
                            f"{q.ndim}, {k.ndim}, {v.ndim})")
    if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"query {q.shape}, key {k.shape}, value {v.shape}: expected "
                            f"(..., L, E), (..., S, E), (..., S, Ev)")
    heads_q = q.shape[-3] if q.ndim >= 3 else 1
    heads_k = k.shape[-3] if k.ndim >= 3 else 1
    if v.ndim >= 3 and v.shape[-3] != heads_k:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"key has {heads_k} heads but value {v.shape[-3]}")
    if heads_q != heads_k and not (enable_gqa and heads_k and heads_q % heads_k == 0):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"query has {heads_q} heads, key and value {heads_k}: pass "
                            f"enable_gqa=True with a divisor of the query heads")
    try:
        batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    except ValueError:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"the batch dims of query {q.shape}, key {k.shape} and value "
                            f"{v.shape} do not broadcast") from None
    batch4 = batch if len(batch) == 1 else (int(np.prod(batch)) if batch else 1,)
    q4 = _to_rank4("query", q if q.ndim >= 3 else q[None], batch)
    k4 = _to_rank4("key", k if k.ndim >= 3 else k[None], batch)
    v4 = _to_rank4("value", v if v.ndim >= 3 else v[None], batch)
    B, L, S = batch4[0], q4.shape[-2], k4.shape[-2]
    Ev = v4.shape[-1]

    mask4 = None
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == np.bool_:
            m = m.astype(np.uint8)
            mask_dtype = _lib.U8
        else:
            m = _as_float("attn_mask", m)
            mask_dtype = clattn_dtype(m.dtype)
        try:
            np.broadcast_shapes(m.shape, batch + (heads_q, L, S))
        except ValueError:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"attn_mask has shape {m.shape}, which does not broadcast to "
                                f"{batch + (heads_q, L, S)}") from None
        if m.ndim > 4 or (m.ndim == 4 and len(batch) != 1):
            m = np.ascontiguousarray(np.broadcast_to(m, batch + (heads_q, L, S)))
            m = m.reshape((B, heads_q, L, S))
        mask4 = (np.ascontiguousarray(m), mask_dtype)

    sinks1 = _sinks_array(sinks, heads_q)
    dtypes = tuple(clattn_dtype(a.dtype) for a in (q4, k4, v4))
    if len(batch) != 1:
        result_shape = tuple(batch) + (heads_q, L, Ev)
    else:
        result_shape = (B, heads_q, L, Ev)
    if q_in.ndim == 2:
        result_shape = (L, Ev)
    elif q_in.ndim == 3 and not batch:
        result_shape = (heads_q, L, Ev)
    return SimpleNamespace(q_in=q_in, q4=q4, k4=k4, v4=v4, batch=tuple(batch), B=B,
                           heads_q=heads_q, L=L, S=S, Ev=Ev, mask4=mask4, sinks1=sinks1,
                           dtypes=dtypes, result_shape=result_shape)


def _strides_of(a):
    """Element strides; a dim of size 1 gets its packed stride (numpy may report 0 there,
    which clattn takes as a broadcast and refuses along the head dim on some paths)."""
    packed_strides = np.cumprod((a.shape[1:] + (1,))[::-1])[::-1]
    return tuple(int(s // a.itemsize) if n > 1 else int(p)
                 for s, n, p in zip(a.strides, a.shape, packed_strides))


def _packed(a):
    """a C-contiguous with its element strides; a broadcast (stride-0) batch is uploaded once."""
    if a.strides[0] == 0 and a.shape[0] > 1:
        one = np.ascontiguousarray(a[:1])
        return one, (0,) + _strides_of(one)[1:]
    c = np.ascontiguousarray(a)
    return c, _strides_of(c)


def _set_dropout(desc, drop: Optional[tuple]) -> None:
    """The descriptor's dropout fields from (p, seed, offset); None leaves dropout off."""
    if drop is not None:
        desc.dropout_p, desc.dropout_seed, desc.dropout_offset = drop


class _Score(NamedTuple):
    """The score options of an SDPA call, checked once: what every plan descriptor of the
    numpy, torch and pyopencl paths (forward, forward with lse, backward) takes, and part of
    each plan's cache key."""
    causal: int
    scale: Optional[float]
    softcap: float
    left: int
    right: int
    path: int


def _score(attn_mask, is_causal, scale, softcap=0.0, window_size=(-1, -1),
           path="auto") -> _Score:
    """The options checked (ArgumentError naming the argument) as a _Score."""
    if path not in _PATHS:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"path={path!r}: expected 'auto', 'fused' or 'unfused'")
    _check_options(attn_mask, is_causal, scale)
    try:
        cap = float(softcap)
    except (TypeError, ValueError):
        cap = float("nan")
    if not math.isfinite(cap) or cap < 0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"softcap={softcap!r}: expected a finite number >= 0 (0: off)")
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        left = right = -2
    if left < -1 or right < -1:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"window_size={window_size!r}: expected (left, right), each -1 "
                            f"(unbounded) or >= 0")
    return _Score(_lib.CAUSAL_TOP_LEFT if is_causal else _lib.CAUSAL_NONE,
                  None if scale is None else float(scale), cap, left, right, _PATHS[path])


def _fill(desc, score: _Score, drop: Optional[tuple] = None) -> None:
    """A plan descriptor's score fields from a _Score (the window is top-left aligned, as
    is_causal: query i sees keys i - left .. i + right) and dropout's from drop."""
    desc.causal = score.causal
    desc.scale = float("nan") if score.scale is None else score.scale
    desc.softcap = score.softcap
    if score.left >= 0 or score.right >= 0:
        desc.window_align = _lib.CAUSAL_TOP_LEFT
        desc.window_left, desc.window_right = score.left, score.right
    desc.path = score.path
    _set_dropout(desc, drop)


@contextlib.contextmanager
def _plan_for(ctx: Context, key: tuple, create, drop: Optional[tuple]):
    """The plan for `key`: the context's cached one, or, with dropout (whose seed is part of
    the plan and changes with every training step), one made for this call and released after
    it (the cache would hold a plan per seed and push out the reusable ones)."""
    if drop is None:
        yield ctx.plan(key, create)
        return
    plan = create()
    try:
        yield plan
    finally:
        lib.clattn_plan_release(plan)


def _needs_grad(*xs) -> bool:
    """Whether torch records a graph now and one of xs is a tensor that requires grad (torch
    is already imported when this is asked: a tensor came in)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _check_options(attn_mask, is_causal, scale) -> None:
    if attn_mask is not None and is_causal:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "attn_mask and is_causal are exclusive (as in PyTorch)")
    if scale is not None and not math.isfinite(scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")


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



def _numpy_key(query, key, value, attn_mask, is_causal, scale, enable_gqa, path):
    """The cache key of a call on numpy arrays (shapes, strides, dtypes, options), or None
    when an argument is not an ndarray."""
    nd = np.ndarray
    if type(query) is not nd or type(key) is not nd or type(value) is not nd:
        return None
    if attn_mask is None:
        mask = None
    elif type(attn_mask) is nd:
        mask = (attn_mask.shape, attn_mask.strides, attn_mask.dtype)
    else:
        return None
    return ("sdpa-np", query.shape, query.strides, query.dtype, key.shape, key.strides,
            key.dtype, value.shape, value.strides, value.dtype, mask, bool(is_causal), scale,
            bool(enable_gqa), path)


# --- pyopencl arrays --------------------------------------------------------------------------

_queue_contexts: dict = {}


def _context_for_queue(queue) -> Context:
    """The clattn context on a pyopencl queue (made once per queue; it retains the queue)."""
    ctx = _queue_contexts.get(queue.int_ptr)
    if ctx is None:
        ctx = _queue_contexts[queue.int_ptr] = Context.from_pyopencl(queue)
    return ctx


def _is_pyopencl(x) -> bool:
    return type(x).__module__.startswith("pyopencl") and hasattr(x, "queue")


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


def paged_attention(query: ArrayLike, k_pages: ArrayLike, v_pages: ArrayLike,
                    block_table: ArrayLike, seqlens_k: ArrayLike, *, is_causal: bool = False,
                    scale: Optional[float] = None, sinks: Optional[ArrayLike] = None,
                    kv_dtype: Optional[str] = None,
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
    dequantizes as it reads.
    torch tensors in give a torch tensor out (every argument, kv_dtype included, reaches the
    same core as for numpy). Not differentiable (clattn's backward refuses paged caches): on
    tensors that require grad while torch records gradients it raises clattn.ArgumentError
    naming them, never a detached result. Raises clattn.ArgumentError naming the argument for
    a block index outside the pool (among a sequence's used blocks), a count past the
    table's pages, or shapes that do not fit. Returns (B, Hq, Lq, Ev) in query's dtype."""
    like = _torch.any_tensor(query, k_pages, v_pages)
    if like is not None:
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
        result = paged_attention(
            _torch.to_numpy(query), _torch.to_numpy(k_pages), _torch.to_numpy(v_pages),
            _torch.to_numpy(block_table), _torch.to_numpy(seqlens_k), is_causal=is_causal,
            scale=scale, sinks=_torch.to_numpy(sinks), kv_dtype=kv_dtype, ctx=ctx)
        return _torch.from_numpy(result, like)
    ctx = ctx or default_context()
    q_in = np.asarray(query)
    block = None  # (clattn dtype, bytes per block) with kv_dtype
    if kv_dtype is not None:
        if kv_dtype not in _lib.BLOCK_TYPES:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"kv_dtype={kv_dtype!r}: expected 'q8_0' or 'q4_0'")
        block = _lib.BLOCK_TYPES[kv_dtype]
    given_blocks = block is not None and np.asarray(k_pages).dtype == np.uint8
    if given_blocks:  # the blocks as a ggml cache holds them: E from the bytes per row
        kb, vb = np.asarray(k_pages), np.asarray(v_pages)
        if kb.ndim != 4 or vb.ndim != 4 or vb.dtype != np.uint8 or kb.shape[-1] % block[1] \
                or vb.shape[-1] % block[1]:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"k_pages {kb.shape} {kb.dtype}, v_pages {vb.shape} {vb.dtype}: "
                                f"{kv_dtype} blocks are uint8 (pages, page_size, Hkv, "
                                f"E // 32 * {block[1]})")
        q = _as_float("query", query)
        kp = np.empty(kb.shape[:3] + (kb.shape[3] // block[1] * 32,), np.float32)  # shapes only
        vp = np.empty(vb.shape[:3] + (vb.shape[3] // block[1] * 32,), np.float32)
    else:
        q, kp, vp = (_as_float(n, a) for n, a in (("query", query), ("k_pages", k_pages),
                                                  ("v_pages", v_pages)))
    table = np.asarray(block_table)
    counts = np.asarray(seqlens_k)
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
    if scale is not None and not math.isfinite(scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")
    sinks1 = _sinks_array(sinks, Hq)
    if block is not None and (E % 32 or vp.shape[-1] % 32):
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"kv_dtype={kv_dtype!r}: the head sizes (k {E}, v {vp.shape[-1]}) "
                            f"must be multiples of 32 (a block holds 32 values)")
    qc = np.ascontiguousarray(q)
    kc, vc = (np.ascontiguousarray(a) for a in ((kb, vb) if given_blocks else (kp, vp)))
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
            sinks1 is not None)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        t, src = desc.tensors, tensors()
        for name in ("q", "k", "v", "out", "block_table", "kv_seqlen", "sinks"):
            setattr(t, name, getattr(src, name))
        desc.causal = _lib.CAUSAL_BOTTOM_RIGHT if is_causal else _lib.CAUSAL_NONE
        desc.scale = float("nan") if scale is None else float(scale)
        desc.path = _lib.PATH_FUSED
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
                blocks = Buffer(ctx, nbytes=pool.size // 32 * block[1])
                buffers.append(blocks)
                getattr(t, name).mem = blocks.mem
                ctx.check(lib.clattn_quantize(ctx.handle, ctypes.byref(src),
                                              ctypes.byref(getattr(t, name)), 0, None, None))
        t.block_table.mem, t.kv_seqlen.mem = buffers[3].mem, buffers[4].mem
        if sinks1 is not None:
            t.sinks.mem = buffers[5].mem
        t.out.mem = buffers[len(arrays)].mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(t), _lib.ROLE_COUNT, None, None, 0,
                                          None, None))
        buffers[len(arrays)].read(ctx, out)
    return out.astype(q_in.dtype) if q_in.dtype == np.float64 else out


def _sdpa_plan(ctx: Context, desc) -> ctypes.c_void_p:
    """An SDPA plan from a filled descriptor (raises clattn's error with its message)."""
    plan = ctypes.c_void_p()
    ctx.check(lib.clattn_sdpa_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(plan)))
    return plan


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
    from .dropout import _probability
    p = _probability(dropout_p)
    if p > 0.0:
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"{entry}: dropout_p={p}: clattn has no dropout on packed "
                            f"variable-length batches (cu_seqlens); pad the batch and use "
                            f"clattn.flash_attn.flash_attn_func or scaled_dot_product_attention "
                            f"with dropout_p, or pass dropout_p=0 (evaluation)")


def varlen_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                     cu_seqlens_k: ArrayLike, max_seqlen_q: Optional[int] = None,
                     max_seqlen_k: Optional[int] = None, dropout_p: float = 0.0,
                     softmax_scale: Optional[float] = None, causal: bool = False,
                     window_size=(-1, -1), softcap: float = 0.0,
                     alibi_slopes: Optional[ArrayLike] = None, deterministic: bool = False,
                     return_attn_probs: bool = False, *, scale: Optional[float] = None,
                     sinks: Optional[ArrayLike] = None, ctx: Optional[Context] = None):
    """Packed variable-length batches with FlashAttention's ``flash_attn_varlen_func``
    signature (the same positional order), in one launch of the fused kernel (no padding, no
    work on other sequences' keys).

    q (total_q, Hq, E), k (total_k, Hkv, E), v (total_k, Hkv, Ev): float32, float16, bfloat16
    (ml_dtypes) or float64 (computed in float32); Hkv divides Hq. cu_seqlens_q and cu_seqlens_k
    (B + 1,) integers from 0, non-decreasing, ending at total_q and total_k: sequence i is rows
    cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1 of q and cu_seqlens_k[i] .. - 1 of k and v, and
    attends only within itself. max_seqlen_q/_k: bounds on the longest spans (None: computed;
    a value below the longest span is refused, one past the total taken as the total).
    dropout_p: must be 0 (clattn has no dropout on packed batches; ArgumentError otherwise).
    softmax_scale (or clattn's older keyword ``scale``): None for 1/sqrt(E). causal and
    window_size (left, right; -1 unbounded) per sequence, bottom-right aligned (its queries
    are its last keys), as FlashAttention's. softcap > 0 caps the scores. alibi_slopes (Hq,)
    or (B, Hq): bias -slope * |i + Lk - Lq - j| per sequence. deterministic: accepted;
    clattn's backward is always deterministic.
    return_attn_probs: return ``(out, lse, None)``, lse float32 (Hq, total_q) (the rows'
    log-sum-exp; the probabilities are not materialised: None). Keyword only: sinks (Hq,)
    attention-sink logits, ctx.
    torch tensors in give torch tensors out (q's dtype and device); where torch records
    gradients and q, k, v or sinks require grad, the result is differentiable (clattn's
    packed backward; alibi_slopes has no gradient and refuses requires_grad).
    Raises clattn.ArgumentError naming the argument for offsets that are not as above.
    Returns (total_q, Hq, Ev) in q's dtype."""
    scale = _scale_alias(softmax_scale, scale)
    _varlen_dropout(dropout_p)
    like = _torch.any_tensor(q, k, v)
    if like is not None:
        if _needs_grad(q, k, v, sinks, alibi_slopes):
            from ._flash_autograd import flash_autograd
            out, lse = flash_autograd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, causal, scale, window_size, softcap,
                                      alibi_slopes, sinks, None, ctx, entry="varlen_attention")
            return (out, lse, None) if return_attn_probs else out
        pb = _flash_problem(*(_torch.to_numpy(a) for a in (q, k, v, cu_seqlens_q,
                                                           cu_seqlens_k)),
                            max_seqlen_q, max_seqlen_k, causal, scale, window_size, softcap,
                            _torch.to_numpy(alibi_slopes), _torch.to_numpy(sinks), None, ctx)
        out, lse = _flash_forward(pb, return_attn_probs)
        out = _torch.from_numpy(out, like)
        if return_attn_probs:
            return out, _torch.from_numpy(lse, like), None
        return out
    pb = _flash_problem(q, k, v, _torch.to_numpy(cu_seqlens_q), _torch.to_numpy(cu_seqlens_k),
                        max_seqlen_q, max_seqlen_k, causal, scale, window_size, softcap,
                        _torch.to_numpy(alibi_slopes), _torch.to_numpy(sinks), None, ctx)
    out, lse = _flash_forward(pb, return_attn_probs)
    return (out, lse, None) if return_attn_probs else out


@_torch.torch_io("quantize")
def quantize(x: ArrayLike, kv_dtype: str, *, ctx: Optional[Context] = None) -> np.ndarray:
    """llama.cpp's block quantization on the clattn device: x (..., E) float32, float16,
    bfloat16 or float64, E a multiple of 32, rank 1 to 4; kv_dtype 'q8_0' (per 32 values an
    fp16 scale amax / 127 and int8 round(x / scale)) or 'q4_0' (an fp16 scale m / -8, m the
    value of largest magnitude, and nibbles min(15, int(x / scale + 8.5)), element j with
    j + 16 in one byte). Returns uint8 (..., E // 32 * 34) or (..., E // 32 * 18): ggml's
    block_q8_0 / block_q4_0 bytes, as ``paged_attention(kv_dtype=...)`` takes them."""
    if kv_dtype not in _lib.BLOCK_TYPES:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"kv_dtype={kv_dtype!r}: expected 'q8_0' or 'q4_0'")
    code, size = _lib.BLOCK_TYPES[kv_dtype]
    a = np.ascontiguousarray(_as_float("x", x))
    if not 1 <= a.ndim <= 4 or a.shape[-1] % 32 or 0 in a.shape:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"x has shape {a.shape}: expected rank 1 to 4 with the last "
                            f"dimension a multiple of 32")
    ctx = ctx or default_context()
    out = np.empty(a.shape[:-1] + (a.shape[-1] // 32 * size,), np.uint8)
    with ctx.lock:
        src_buf, dst_buf = Buffer(ctx, a), Buffer(ctx, nbytes=out.nbytes)
        src, dst = layout(clattn_dtype(a.dtype), a.shape), layout(code, a.shape)
        src.mem, dst.mem = src_buf.mem, dst_buf.mem
        ctx.check(lib.clattn_quantize(ctx.handle, ctypes.byref(src), ctypes.byref(dst), 0, None,
                                      None))
        dst_buf.read(ctx, out)
    return out
