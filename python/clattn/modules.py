"""clattn.MultiheadAttention: PyTorch's nn.MultiheadAttention forward (eval mode) on clattn."""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Optional, Tuple

import numpy as np

from . import _lib
from ._core import ArgumentError, Buffer, Context, default_context, layout
from ._lib import lib

_PATHS = {"auto": _lib.PATH_AUTO, "fused": _lib.PATH_FUSED, "unfused": _lib.PATH_UNFUSED}


def _numpy(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    if a.dtype.kind != "f":
        raise TypeError(f"clattn: {name} has dtype {a.dtype}; expected floats")
    return np.ascontiguousarray(a, dtype=np.float32)


class MultiheadAttention:
    """``torch.nn.MultiheadAttention``'s forward in eval mode, on the clattn device.

    Same constructor meanings (embed_dim, num_heads, bias, kdim, vdim, batch_first; dropout
    is accepted and ignored: eval mode; add_bias_kv and add_zero_attn are not supported).
    Load the weights with :meth:`load_state_dict` (a PyTorch module's ``state_dict()``, tensors
    or numpy arrays), then call it like the PyTorch module. Weights live on the device from
    then on; plans are made once per input shape."""

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
        self._weights = weights
        self._plans = {}

    def __call__(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                 attn_mask=None, average_attn_weights: bool = True,
                 is_causal: bool = False) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """(output, weights) as PyTorch returns them: output (N, L, E) (batch_first), (L, N, E)
        or (L, E) unbatched; weights (N, L, S) averaged over heads, (N, H, L, S) with
        average_attn_weights=False, or None with need_weights=False. key_padding_mask (N, S)
        bool (True = ignore the key) or float (added); attn_mask (L, S) or (N * H, L, S), bool
        (True = NOT allowed, PyTorch's MHA convention) or float (added); is_causal: query i
        sees keys j <= i (with or without attn_mask)."""
        if not self._weights:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "no weights: call load_state_dict first")
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
            self.ctx.check(lib.clattn_plan_execute(plan, ctypes.byref(tensors), None, None, 0,
                                                   None, None))
            buffers["out"].read(self.ctx, out)
            if weights is not None:
                buffers["weights"].read(self.ctx, weights)
        if not batched:
            return out[0], (weights[0] if weights is not None else None)
        if not self.batch_first:
            out = np.ascontiguousarray(out.transpose(1, 0, 2))
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

    def __del__(self) -> None:
        for plan in getattr(self, "_plans", {}).values():
            try:
                lib.clattn_plan_release(plan)
            except Exception:
                pass
