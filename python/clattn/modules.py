"""clattn.NumpyMultiheadAttention: PyTorch's nn.MultiheadAttention forward (eval mode) on clattn,
for numpy (and pyopencl) arrays. Torch users: clattn.MultiheadAttention, an nn.Module."""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Optional, Tuple

import numpy as np

from . import _lib, _torch
from ._core import ArgumentError, ArrayLike, Buffer, Context, default_context, layout
from ._lib import lib
from ._common import _needs_grad

_PATHS = {"auto": _lib.PATH_AUTO, "fused": _lib.PATH_FUSED, "unfused": _lib.PATH_UNFUSED}


def _numpy(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        raise TypeError(f"clattn: {name} has dtype {a.dtype}; expected floats")
    return np.ascontiguousarray(a, dtype=np.float32)


class NumpyMultiheadAttention:
    """``torch.nn.MultiheadAttention``'s forward in eval mode, on the clattn device, for numpy
    users (no torch needed). Torch users want ``clattn.MultiheadAttention``, the nn.Module
    (parameters, state_dict, .to, autograd); this class refuses tensors that require grad.

    Same constructor meanings (embed_dim, num_heads, bias, kdim, vdim, batch_first; dropout
    is accepted and ignored: eval mode; add_bias_kv and add_zero_attn are not supported).
    Load the weights with :meth:`load_state_dict` (a PyTorch module's ``state_dict()``, tensors
    or numpy arrays), then call it like the PyTorch module. Weights live on the device from
    then on; plans are made once per input shape.

    Inputs: numpy arrays (computed in float32, numpy results), torch tensors (torch results
    of the query's dtype on its device; CPU tensors are read through numpy views), or
    pyopencl arrays when the module is made with ``ctx=clattn.Context.from_pyopencl(queue)``
    (read where they lie, results are pyopencl arrays on that queue).

        mha = clattn.NumpyMultiheadAttention(512, 8, batch_first=True)
        mha.load_state_dict(torch_module.state_dict())
        out, weights = mha(x, x, x, need_weights=False)"""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, *, ctx: Optional[Context] = None,
                 path: str = "auto"):
        if add_bias_kv or add_zero_attn:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "add_bias_kv and add_zero_attn are not supported")
        if num_heads <= 0 or embed_dim % num_heads != 0:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"embed_dim={embed_dim} must be divisible by "
                                f"num_heads={num_heads}")
        if path not in _PATHS:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"path={path!r}: expected 'auto', 'fused' or 'unfused'")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.packed = self.kdim == embed_dim and self.vdim == embed_dim
        self.bias, self.batch_first, self.path = bias, batch_first, path
        self.ctx = ctx or default_context()
        self._weights: dict = {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Takes nn.MultiheadAttention's state_dict: in_proj_weight (3E, E) or
        q_proj_weight / k_proj_weight / v_proj_weight (with kdim/vdim), in_proj_bias (3E),
        out_proj.weight (E, E), out_proj.bias (E). Missing or misshapen entries raise."""
        e = self.embed_dim
        want = {"out_proj.weight": (e, e)}
        if self.packed:
            want["in_proj_weight"] = (3 * e, e)
        else:
            want.update({"q_proj_weight": (e, e), "k_proj_weight": (e, self.kdim),
                         "v_proj_weight": (e, self.vdim)})
        if self.bias:
            want.update({"in_proj_bias": (3 * e,), "out_proj.bias": (e,)})
        unknown = set(state) - set(want)
        if unknown & {"bias_k", "bias_v"}:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, "bias_k/bias_v are not supported")
        weights = {}
        for name, shape in want.items():
            if name not in state:
                raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"state_dict lacks {name}")
            a = _numpy(state[name], name)
            if a.shape != shape:
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"{name} has shape {a.shape}, expected {shape}")
            weights[name] = (a, Buffer(self.ctx, a))
        self._release_plans()
        self._weights = weights
        self._plans = {}

    def __call__(self, query: ArrayLike, key: ArrayLike, value: ArrayLike,
                 key_padding_mask: Optional[ArrayLike] = None, need_weights: bool = True,
                 attn_mask: Optional[ArrayLike] = None, average_attn_weights: bool = True,
                 is_causal: bool = False) -> Tuple[ArrayLike, Optional[ArrayLike]]:
        """(output, weights) as PyTorch returns them: output (N, L, E) (batch_first), (L, N, E)
        or (L, E) unbatched; weights (N, L, S) averaged over heads, (N, H, L, S) with
        average_attn_weights=False, or None with need_weights=False. key_padding_mask (N, S)
        bool (True = ignore the key) or float (added); attn_mask (L, S) or (N * H, L, S), bool
        (True = NOT allowed, PyTorch's MHA convention) or float (added); is_causal: query i
        sees keys j <= i (with or without attn_mask)."""
        if not self._weights:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "no weights: call load_state_dict first")
        if any(_is_pyopencl(a) for a in (query, key, value)):
            return self._call_device(query, key, value, key_padding_mask, need_weights,
                                     attn_mask, average_attn_weights, is_causal)
        like = _torch.any_tensor(query, key, value)
        if like is not None and _needs_grad(query, key, value, attn_mask, key_padding_mask):
            raise TypeError("clattn.NumpyMultiheadAttention computes no gradients, and these "
                            "tensors require grad: use clattn.MultiheadAttention (an "
                            "nn.Module with torch's autograd), or call under torch.no_grad()")
        if like is not None:  # torch in, torch out (of the query's dtype, on its device)
            out, weights = self(*(_torch.to_numpy(a) for a in (query, key, value)),
                                _torch.to_numpy(key_padding_mask), need_weights,
                                _torch.to_numpy(attn_mask), average_attn_weights, is_causal)
            dtype = like.dtype if like.dtype.is_floating_point else None
            return (_torch.from_numpy(out, like, dtype),
                    _torch.from_numpy(weights, like, dtype))
        q, k, v = _numpy(query, "query"), _numpy(key, "key"), _numpy(value, "value")
        batched = q.ndim == 3
        if q.ndim not in (2, 3) or k.ndim != q.ndim or v.ndim != q.ndim:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"query, key, value must all be 3-d (batched) or 2-d, got "
                                f"{q.ndim}, {k.ndim}, {v.ndim}")
        if not batched:
            q, k, v = q[None], k[None], v[None]
        elif not self.batch_first:
            q, k, v = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v))
        n, l, e = q.shape
        s = k.shape[1]
        h = self.num_heads
        if e != self.embed_dim or k.shape[2] != self.kdim or v.shape[2] != self.vdim or \
                k.shape[0] != n or v.shape[:2] != (n, s):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"query {q.shape}, key {k.shape}, value {v.shape} (batch "
                                f"first): expected (N, L, {self.embed_dim}), (N, S, "
                                f"{self.kdim}), (N, S, {self.vdim})")
        mask, padding = self._host_masks(attn_mask, key_padding_mask, batched, n, h, l, s)
        need = _lib.WEIGHTS_NONE if not need_weights else (
            _lib.WEIGHTS_AVERAGED if average_attn_weights else _lib.WEIGHTS_PER_HEAD)
        w_shape = (n, l, s) if need == _lib.WEIGHTS_AVERAGED else (n, h, l, s)
        key_ = (q.shape, k.shape, v.shape, None if mask is None else (mask[0].shape, mask[1]),
                padding is not None, need, bool(is_causal))
        plan = self._plans.get(key_)
        layouts = self._layouts(q, k, v, mask, padding, need, w_shape)
        if plan is None:
            plan = self._create(layouts, need, is_causal)
            self._plans[key_] = plan
        out = np.empty((n, l, e), np.float32)
        weights = np.empty(w_shape, np.float32) if need != _lib.WEIGHTS_NONE else None
        with self.ctx.lock:
            buffers = {"q": Buffer(self.ctx, q), "k": Buffer(self.ctx, k),
                       "v": Buffer(self.ctx, v), "out": Buffer(self.ctx, nbytes=out.nbytes)}
            if mask is not None:
                buffers["attn_mask"] = Buffer(self.ctx, mask[0])
            if padding is not None:
                buffers["key_padding_mask"] = Buffer(self.ctx, padding)
            if weights is not None:
                buffers["weights"] = Buffer(self.ctx, nbytes=weights.nbytes)
            tensors = _lib.Tensors()
            for name, (t, buffer_name, offset) in layouts.items():
                setattr(tensors, name, t)
                getattr(tensors, name).mem = (buffers[buffer_name].mem if buffer_name in buffers
                                              else self._weights[buffer_name][1].mem)
                getattr(tensors, name).offset = offset
            self.ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(tensors), _lib.ROLE_COUNT,
                                                   None, None, 0, None, None))
            buffers["out"].read(self.ctx, out)
            if weights is not None:
                buffers["weights"].read(self.ctx, weights)
        if not batched:
            return out[0], (weights[0] if weights is not None else None)
        if not self.batch_first:
            out = np.ascontiguousarray(out.transpose(1, 0, 2))
        return out, weights

    def _host_masks(self, attn_mask, key_padding_mask, batched, n, h, l, s):
        """The masks as host arrays in clattn's conventions: (attn_mask, clattn dtype) or None
        (U8 nonzero = takes part, or F32 added), and the U8 key padding (nonzero = ignore) or
        None (a float padding mask is folded into a float attn_mask)."""
        mask = None  # (array, clattn dtype) broadcast to (N, H, L, S)
        if attn_mask is not None:
            m = np.asarray(attn_mask.detach().cpu().numpy() if hasattr(attn_mask, "detach")
                           else attn_mask)
            if m.shape == (l, s):
                pass
            elif m.shape == (n * h, l, s):
                m = m.reshape(n, h, l, s)
            else:
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"attn_mask has shape {m.shape}, expected ({l}, {s}) or "
                                    f"({n * h}, {l}, {s})")
            mask = (np.ascontiguousarray(~m).astype(np.uint8), _lib.U8) if m.dtype == np.bool_ \
                else (np.ascontiguousarray(m, dtype=np.float32), _lib.F32)
        padding = None
        if key_padding_mask is not None:
            p = np.asarray(key_padding_mask.detach().cpu().numpy()
                           if hasattr(key_padding_mask, "detach") else key_padding_mask)
            if not batched:
                p = p[None]
            if p.shape != (n, s):
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"key_padding_mask has shape {p.shape}, expected ({n}, {s})")
            if p.dtype == np.bool_:
                padding = np.ascontiguousarray(p).astype(np.uint8)
            else:  # a float padding mask is added: fold it into a float attn_mask
                add = p.astype(np.float32).reshape(n, 1, 1, s)
                base = np.zeros((1, 1, l, s), np.float32)
                if mask is not None:
                    base = (np.where(mask[0] != 0, 0.0, -np.inf).astype(np.float32)
                            if mask[1] == _lib.U8 else mask[0])
                mask = (np.ascontiguousarray(np.broadcast_to(base + add, (n, h, l, s)),
                                             dtype=np.float32), _lib.F32)
        return mask, padding

    def _call_device(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                     average_attn_weights, is_causal):
        """The call on pyopencl arrays of the module's context: read where they lie (any
        strides with unit stride along the features; (L, N, E) without batch_first is viewed,
        not copied), the output written in the input's layout on the module's queue, returned
        as pyopencl arrays. Masks may be numpy arrays (uploaded) or pyopencl arrays (a float
        attn_mask and a uint8/bool key_padding_mask are used where they lie; other kinds are
        read back and converted)."""
        import pyopencl.array as cla
        from ._core import clattn_dtype
        arrays = (query, key, value)
        if not all(_is_pyopencl(a) for a in arrays):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "query, key and value must all be pyopencl arrays, or none")
        queue = getattr(self.ctx, "_pyopencl_queue", None)
        context = lib.clattn_ctx_cl_context(self.ctx.handle)
        if queue is None or any(a.context.int_ptr != context for a in arrays):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "pyopencl inputs need the module made with ctx="
                                "clattn.Context.from_pyopencl(queue) on their OpenCL context")
        nd = query.ndim
        if nd not in (2, 3) or key.ndim != nd or value.ndim != nd:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"query, key, value must all be 3-d (batched) or 2-d, got "
                                f"{query.ndim}, {key.ndim}, {value.ndim}")

        def view(name, a):
            """(dims, strides) in elements as (N, L, features)."""
            if any(st % a.dtype.itemsize for st in a.strides) or a.offset % a.dtype.itemsize:
                raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                    f"{name}: strides and offset must be whole elements")
            dims, strides = list(a.shape), [st // a.dtype.itemsize for st in a.strides]
            if nd == 2:
                dims, strides = [1] + dims, [0] + strides
            elif not self.batch_first:
                dims[0], dims[1] = dims[1], dims[0]
                strides[0], strides[1] = strides[1], strides[0]
            t = layout(clattn_dtype(a.dtype), dims, strides)
            t.mem, t.offset = a.base_data.int_ptr, a.offset // a.dtype.itemsize
            return t

        tq, tk, tv = view("query", query), view("key", key), view("value", value)
        n, l, e = tq.dims[0], tq.dims[1], tq.dims[2]
        s, h = tk.dims[1], self.num_heads
        if e != self.embed_dim or tk.dims[2] != self.kdim or tv.dims[2] != self.vdim or \
                tk.dims[0] != n or (tv.dims[0], tv.dims[1]) != (n, s):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"query {query.shape}, key {key.shape}, value {value.shape}: "
                                f"expected {self.embed_dim}, {self.kdim}, {self.vdim} features "
                                f"and matching batch and key lengths")
        out = cla.empty(queue, query.shape, query.dtype)
        to = view("out", out)
        keep = []  # uploaded masks: released after the launch completes

        def host(a):
            return a.get() if _is_pyopencl(a) else a

        tensors = _lib.Tensors()
        mask_t = pad_t = None
        if _is_pyopencl(attn_mask) and attn_mask.dtype != np.bool_ and \
                attn_mask.dtype.kind == "f" and (key_padding_mask is None or
                                                 not _is_float(key_padding_mask)):
            m = attn_mask
            if m.shape == (n * h, l, s):
                m = m.reshape(n, h, l, s)
            if m.shape not in ((l, s), (n, h, l, s)):
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"attn_mask has shape {attn_mask.shape}, expected ({l}, {s})"
                                    f" or ({n * h}, {l}, {s})")
            mask_t = layout(clattn_dtype(m.dtype), m.shape,
                            [st // m.dtype.itemsize for st in m.strides])
            mask_t.mem, mask_t.offset = m.base_data.int_ptr, m.offset // m.dtype.itemsize
            attn_mask = None
        if _is_pyopencl(key_padding_mask) and key_padding_mask.dtype in (np.bool_, np.uint8):
            p = key_padding_mask if nd == 3 else key_padding_mask.reshape(1, s)
            if p.shape != (n, s):
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"key_padding_mask has shape {key_padding_mask.shape}, "
                                    f"expected ({n}, {s})")
            pad_t = layout(_lib.U8, (n, s), [st // p.dtype.itemsize for st in p.strides])
            pad_t.mem, pad_t.offset = p.base_data.int_ptr, p.offset
            key_padding_mask = None
        mask, padding = self._host_masks(None if attn_mask is None else host(attn_mask),
                                         None if key_padding_mask is None else
                                         host(key_padding_mask), nd == 3, n, h, l, s)
        if mask is not None:
            keep.append(Buffer(self.ctx, mask[0]))
            mask_t = layout(mask[1], mask[0].shape)
            mask_t.mem = keep[-1].mem
        if padding is not None:
            keep.append(Buffer(self.ctx, padding))
            pad_t = layout(_lib.U8, padding.shape)
            pad_t.mem = keep[-1].mem
        need = _lib.WEIGHTS_NONE if not need_weights else (
            _lib.WEIGHTS_AVERAGED if average_attn_weights else _lib.WEIGHTS_PER_HEAD)
        w_shape = (n, l, s) if need == _lib.WEIGHTS_AVERAGED else (n, h, l, s)
        weights = cla.empty(queue, w_shape, np.float32) if need != _lib.WEIGHTS_NONE else None
        roles = self._layouts(np.empty((n, l, e)), np.empty((n, s, self.kdim)),
                              np.empty((n, s, self.vdim)), None, None, _lib.WEIGHTS_NONE, None)
        for name, (t, buffer_name, offset) in roles.items():
            if name in ("q", "k", "v", "out"):
                continue
            setattr(tensors, name, t)
            getattr(tensors, name).mem = self._weights[buffer_name][1].mem
            getattr(tensors, name).offset = offset
        tensors.q, tensors.k, tensors.v, tensors.out = tq, tk, tv, to
        if mask_t is not None:
            tensors.attn_mask = mask_t
        if pad_t is not None:
            tensors.key_padding_mask = pad_t
        if weights is not None:
            tensors.weights = layout(_lib.F32, w_shape)
            tensors.weights.mem = weights.base_data.int_ptr
        shape_key = tuple((t.dtype, tuple(t.dims), tuple(t.strides)) for t in
                          (tq, tk, tv, to))
        key_ = ("device", shape_key,
                None if mask_t is None else (mask_t.dtype, mask_t.rank, tuple(mask_t.dims),
                                             tuple(mask_t.strides)),
                None if pad_t is None else tuple(pad_t.strides), need, bool(is_causal))
        with self.ctx.lock:
            plan = self._plans.get(key_)
            if plan is None:
                desc_layouts = {name: (getattr(tensors, name), None, 0) for name, _ in
                                _lib.Tensors._fields_ if getattr(tensors, name).rank}
                plan = self._create(desc_layouts, need, is_causal)
                self._plans[key_] = plan
            self.ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(tensors), _lib.ROLE_COUNT,
                                                   None, None, 0, None, None))
            if keep:  # uploaded masks must outlive the kernels that read them
                self.ctx.check(lib.clattn_finish(self.ctx.handle))
        if nd == 2 and weights is not None:
            weights = weights.reshape(w_shape[1:])
        return out, weights

    def _layouts(self, q, k, v, mask, padding, need, w_shape) -> dict:
        """tensor role -> (layout, buffer name (an input's or a weight's), element offset)."""
        e = self.embed_dim
        f32 = _lib.F32
        roles = {"q": (layout(f32, q.shape), "q", 0), "k": (layout(f32, k.shape), "k", 0),
                 "v": (layout(f32, v.shape), "v", 0),
                 "out": (layout(f32, q.shape), "out", 0),
                 "out_weight": (layout(f32, (e, e)), "out_proj.weight", 0)}
        if self.packed:
            roles["in_proj_weight"] = (layout(f32, (3 * e, e)), "in_proj_weight", 0)
            if self.bias:
                roles["in_proj_bias"] = (layout(f32, (3 * e,)), "in_proj_bias", 0)
        else:
            roles["q_weight"] = (layout(f32, (e, e)), "q_proj_weight", 0)
            roles["k_weight"] = (layout(f32, (e, self.kdim)), "k_proj_weight", 0)
            roles["v_weight"] = (layout(f32, (e, self.vdim)), "v_proj_weight", 0)
            if self.bias:  # slices of in_proj_bias
                for i, name in enumerate(("q_bias", "k_bias", "v_bias")):
                    roles[name] = (layout(f32, (e,)), "in_proj_bias", i * e)
        if self.bias:
            roles["out_bias"] = (layout(f32, (e,)), "out_proj.bias", 0)
        if mask is not None:
            roles["attn_mask"] = (layout(mask[1], mask[0].shape), "attn_mask", 0)
        if padding is not None:
            roles["key_padding_mask"] = (layout(_lib.U8, padding.shape), "key_padding_mask", 0)
        if need != _lib.WEIGHTS_NONE:
            roles["weights"] = (layout(f32, w_shape), "weights", 0)
        return roles

    def _create(self, layouts: dict, need: int, is_causal: bool) -> ctypes.c_void_p:
        desc = _lib.MhaDesc()
        lib.clattn_mha_desc_init(ctypes.byref(desc))
        for name, (t, _, _) in layouts.items():
            setattr(desc.tensors, name, t)
        desc.num_heads = self.num_heads
        desc.layout = _lib.LAYOUT_TORCH
        desc.causal = _lib.CAUSAL_TOP_LEFT if is_causal else _lib.CAUSAL_NONE
        desc.need_weights = need
        desc.path = _PATHS[self.path]
        plan = ctypes.c_void_p()
        self.ctx.check(lib.clattn_mha_plan_create(self.ctx.handle, ctypes.byref(desc),
                                                  ctypes.byref(plan)))
        return plan

    def _release_plans(self) -> None:
        plans, self._plans = getattr(self, "_plans", {}), {}
        for plan in plans.values():
            lib.clattn_plan_release(plan)

    def __del__(self) -> None:
        try:
            self._release_plans()
        except Exception:
            pass


def _is_pyopencl(x) -> bool:
    return type(x).__module__.startswith("pyopencl") and hasattr(x, "queue")


def _is_float(x) -> bool:
    try:
        return np.dtype(x.dtype).kind == "f"
    except TypeError:  # a torch dtype: the host path converts it
        return True
