"""scaled_dot_product_attention below its torch.compile and autograd routes: the options
checked once, torch tensors through numpy views, pyopencl arrays handed to _pyopencl, and the
numpy path (the problem brought to rank 4, the plan, and the prepared fast path of repeated
calls). autograd's forward calls :func:`sdpa_arrays` here, so that it never imports the
public entry (_sdpa_entry), which imports autograd."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Optional

import numpy as np

from . import _lib, _torch
from ._common import (_Score, _as_float, _fill, _is_pyopencl, _plan_for, _score, _sdpa_plan,
                      _sinks_array)
from ._core import (ArgumentError, Buffer, Context, Prepared, clattn_dtype, default_context,
                    layout)
from ._lib import lib
from ._pyopencl import _sdpa_pyopencl
from .dropout import _dropout_args


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


def checked_options(query, key, value, attn_mask, dropout_p, is_causal, scale, softcap,
                    window_size, path, need_weights, dropout_seed, dropout_offset, generator):
    """The options of an SDPA call checked (in the order the public entry always checked
    them): (like, drop, sc), like the first torch tensor of query, key, value (or None), drop
    dropout's (p, seed, offset) or None (a seed drawn from torch's generator where needed),
    sc the _Score."""
    if not isinstance(dropout_p, (int, float, np.integer, np.floating)) or \
            isinstance(dropout_p, (bool, np.bool_)) or not 0.0 <= float(dropout_p) <= 1.0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"dropout_p={dropout_p!r}: expected a probability in [0, 1] (the "
                            f"5th positional argument, as in torch; is_causal is the 6th)")
    like = _torch.any_tensor(query, key, value)
    drop = _dropout_args(dropout_p, dropout_seed, dropout_offset,
                         torch_inputs=like is not None, generator=generator)
    sc = _score(attn_mask, is_causal, scale, softcap, window_size, path)
    if need_weights and sc.path == _lib.PATH_FUSED:
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            "need_weights=True: the weights come from the unfused path; "
                            "path='fused' never forms them")
    return like, drop, sc


def sdpa_arrays(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: Optional[float] = None,
                enable_gqa: bool = False, *, ctx: Optional[Context] = None,
                path: str = "auto", sinks=None, softcap: float = 0.0, window_size=(-1, -1),
                need_weights: bool = False, dropout_seed: Optional[int] = None,
                dropout_offset: int = 0, generator=None):
    """clattn.scaled_dot_product_attention's arguments and result without its torch.compile
    and autograd routes: what autograd's forward runs on numpy arrays."""
    like, drop, sc = checked_options(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                     softcap, window_size, path, need_weights, dropout_seed,
                                     dropout_offset, generator)
    return run_checked(query, key, value, attn_mask, is_causal, scale, enable_gqa, ctx, path,
                       sinks, softcap, window_size, need_weights, like, drop, sc)


def run_checked(query, key, value, attn_mask, is_causal, scale, enable_gqa, ctx, path, sinks,
                softcap, window_size, need_weights, like, drop, sc: _Score):
    """An SDPA call whose options checked_options gave (like, drop, sc): torch tensors (none
    requiring grad) through numpy views, pyopencl arrays where they lie, else numpy."""
    if like is not None:  # torch in, torch out: numpy views of the tensors' memory
        p, seed, offset = drop if drop is not None else (0.0, None, 0)
        result = sdpa_arrays(
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
    return _sdpa_numpy(query, key, value, attn_mask, is_causal, scale, enable_gqa, ctx, path,
                       sinks, need_weights, drop, sc)


def _sdpa_numpy(query, key, value, attn_mask, is_causal, scale, enable_gqa, ctx, path, sinks,
                need_weights, drop, sc: _Score):
    """The numpy path: a repeated call's prepared plan (copies and a launch), else the problem
    brought to rank 4 and run, preparing that fast path for the next call where it can."""
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
    (qc, qs), (kc, ks), (vc, vs) = _packed(pb.q4), _packed(pb.k4), _packed(pb.v4)
    strides = (qs, ks, vs)
    weights = np.empty((pb.B, pb.heads_q, pb.L, pb.S), np.float32) if need_weights else None
    key_ = ("sdpa", pb.q4.shape, pb.k4.shape, pb.v4.shape, pb.dtypes, qs, ks, vs,
            None if pb.mask4 is None else (pb.mask4[0].shape, pb.mask4[1]), sc,
            pb.sinks1 is not None, drop, need_weights)

    def create():
        desc = _lib.SdpaDesc()
        lib.clattn_sdpa_desc_init(ctypes.byref(desc))
        _bind_layouts(desc.tensors, pb, strides, weights)
        _fill(desc, sc, drop)
        return _sdpa_plan(ctx, desc)

    raw = [query, key, value] + ([attn_mask] if attn_mask is not None else [])
    uploads = [qc, kc, vc] + ([pb.mask4[0]] if pb.mask4 is not None else [])
    if fast_key is not None and all(
            r.flags.c_contiguous and r.nbytes == u.nbytes and u.nbytes > 0 and
            (r.dtype == u.dtype or (r.dtype == np.bool_ and u.dtype == np.uint8))
            for r, u in zip(raw, uploads)):
        return _prepare(ctx, fast_key, key_, create, pb, strides, uploads, raw)
    return _run_once(ctx, key_, create, drop, pb, strides, uploads, weights)


def _bind_layouts(t, pb, strides, weights) -> None:
    """The layouts of q, k, v, out and (where given) attn_mask, sinks and weights set on t (a
    descriptor's tensors or a call's)."""
    qs, ks, vs = strides
    t.q = layout(pb.dtypes[0], pb.q4.shape, qs)
    t.k = layout(pb.dtypes[1], pb.k4.shape, ks)
    t.v = layout(pb.dtypes[2], pb.v4.shape, vs)
    t.out = layout(pb.dtypes[0], (pb.B, pb.heads_q, pb.L, pb.Ev))
    if pb.mask4 is not None:
        t.attn_mask = layout(pb.mask4[1], pb.mask4[0].shape)
    if pb.sinks1 is not None:
        t.sinks = layout(_lib.F32, pb.sinks1.shape)
    if weights is not None:
        t.weights = layout(_lib.F32, weights.shape)


def _prepare(ctx, fast_key, key_, create, pb, strides, uploads, raw):
    """Later calls of these shapes go straight to Prepared.run (the arrays' bytes are what
    this call uploads): the plan with its layouts stored under fast_key, then run."""
    tensors = _lib.Tensors()
    _bind_layouts(tensors, pb, strides, None)
    roles = list(zip(("q", "k", "v", "attn_mask"), (u.nbytes for u in uploads)))
    with ctx.lock:
        plan = ctx.take(key_) or create()
        try:
            prepared = Prepared(ctx, plan, tensors, roles, "out",
                                (pb.B, pb.heads_q, pb.L, pb.Ev), pb.q4.dtype)
        except BaseException:
            lib.clattn_plan_release(plan)
            raise
        prepared.result_shape = pb.result_shape
        ctx.store(fast_key, prepared)
        return prepared.run(ctx, raw).reshape(pb.result_shape)


def _run_once(ctx, key_, create, drop, pb, strides, uploads, weights):
    """Upload, launch and read back (the weights too where asked): the result in the
    caller's shape and dtype, or (out, weights)."""
    out = np.empty((pb.B, pb.heads_q, pb.L, pb.Ev), dtype=pb.q4.dtype)
    with ctx.lock, _plan_for(ctx, key_, create, drop) as plan:
        tensors = _lib.Tensors()
        _bind_layouts(tensors, pb, strides, weights)
        buffers = [Buffer(ctx, uploads[0]), Buffer(ctx, uploads[1]), Buffer(ctx, uploads[2]),
                   Buffer(ctx, nbytes=out.nbytes)]
        roles = ["q", "k", "v", "out"]
        if pb.mask4 is not None:
            buffers.append(Buffer(ctx, pb.mask4[0]))
            roles.append("attn_mask")
        if pb.sinks1 is not None:
            buffers.append(Buffer(ctx, pb.sinks1))
            roles.append("sinks")
        if weights is not None:
            buffers.append(Buffer(ctx, nbytes=weights.nbytes))
            roles.append("weights")
        for role, buffer in zip(roles, buffers):
            getattr(tensors, role).mem = buffer.mem
        ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(tensors), _lib.ROLE_COUNT,
                                          None, None, 0, None, None))
        buffers[3].read(ctx, out)
        if weights is not None:
            buffers[-1].read(ctx, weights)
    result = out.reshape(pb.result_shape)
    if pb.q_in.dtype == np.float64:
        result = result.astype(pb.q_in.dtype)
    if weights is None:
        return result
    return result, weights.reshape(pb.result_shape[:-1] + (pb.S,)).astype(result.dtype,
                                                                          copy=False)


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
