"""clattn's attention as a torch.autograd.Function: the forward runs clattn's forward with the
rows' log-sum-exp kept, the backward runs clattn's backward (clattn_sdpa_backward_plan_create).

``clattn.scaled_dot_product_attention`` comes here by itself for torch tensors that require
grad (while torch.is_grad_enabled()); ``sdpa_autograd`` is the same call made directly. This
module imports torch: numpy users never import it."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from . import _torch, functional
from ._core import Context
from .dropout import _dropout_args


def _as_tensor(x, like: torch.Tensor):
    """A numpy (or list) argument as a tensor on like's device; tensors and None as they are."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    a = np.asarray(x)
    if a.dtype == np.bool_:
        return torch.from_numpy(np.ascontiguousarray(a)).to(like.device)
    return torch.as_tensor(a, device=like.device)


class SdpaFunction(torch.autograd.Function):
    """apply(query, key, value, attn_mask, sinks, is_causal, scale, enable_gqa, ctx, path,
    dropout_p, dropout_seed, dropout_offset): scaled_dot_product_attention with clattn's
    backward. Gradients flow to query, key, value, a float attn_mask and sinks (a bool mask
    has none); with grouped heads (enable_gqa) the key and value gradients sum their group's
    query heads. Dropout (dropout_p > 0) takes an explicit integer dropout_seed: the forward
    keeps (dropout_p, dropout_seed, dropout_offset), never the mask, and the backward
    regenerates the mask from them. Once differentiable (no double backward)."""

    @staticmethod
    def forward(fctx, query, key, value, attn_mask, sinks, is_causal, scale, enable_gqa,
                cl_ctx, path, dropout_p=0.0, dropout_seed=None, dropout_offset=0):
        dropout = dict(dropout_p=dropout_p, dropout_seed=dropout_seed,
                       dropout_offset=dropout_offset)
        arrays = (_torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
                  _torch.to_numpy(attn_mask))
        if path == "unfused":  # no lse there: the backward's unfused path recomputes P whole
            out = functional.scaled_dot_product_attention(
                *arrays, dropout_p, is_causal, scale, enable_gqa, sinks=_torch.to_numpy(sinks),
                ctx=cl_ctx, path=path, dropout_seed=dropout_seed, dropout_offset=dropout_offset)
            lse = None
        else:
            out, lse = functional.sdpa_forward(
                *arrays, is_causal, scale, enable_gqa, sinks=_torch.to_numpy(sinks),
                ctx=cl_ctx, path=path, **dropout)
        result = _torch.from_numpy(out, query, query.dtype)
        fctx.save_for_backward(query, key, value, result, attn_mask, sinks)
        fctx.lse = lse  # numpy float32: no tensor of the graph, nothing for autograd to track
        fctx.options = (is_causal, scale, enable_gqa, cl_ctx, path)
        fctx.dropout = dropout  # the seed and offset: the backward redraws the same mask
        return result

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out):
        query, key, value, out, attn_mask, sinks = fctx.saved_tensors
        is_causal, scale, enable_gqa, cl_ctx, path = fctx.options
        needs = fctx.needs_input_grad
        want_mask = attn_mask is not None and needs[3] and attn_mask.dtype != torch.bool
        grads = functional.sdpa_backward(
            _torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
            _torch.to_numpy(out), fctx.lse, _torch.to_numpy(grad_out),
            _torch.to_numpy(attn_mask), is_causal, scale, enable_gqa,
            sinks=_torch.to_numpy(sinks), ctx=cl_ctx, want_mask_grad=want_mask,
            path="unfused" if path == "unfused" else "auto", **fctx.dropout)

        def tensor(g, like, needed):
            return _torch.from_numpy(g, like, like.dtype) if needed and g is not None else None

        return (tensor(grads[0], query, needs[0]), tensor(grads[1], key, needs[1]),
                tensor(grads[2], value, needs[2]),
                tensor(grads.grad_attn_mask, attn_mask, want_mask),
                tensor(grads.grad_sinks, sinks, sinks is not None and needs[4]),
                None, None, None, None, None, None, None, None)


def sdpa_autograd(query, key, value, attn_mask=None, is_causal: bool = False,
                  scale: Optional[float] = None, enable_gqa: bool = False, *, sinks=None,
                  ctx: Optional[Context] = None, path: str = "auto", dropout_p: float = 0.0,
                  dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                  generator=None) -> torch.Tensor:
    """``clattn.scaled_dot_product_attention`` through :class:`SdpaFunction` (differentiable
    in query, key, value, a float attn_mask and sinks). The arguments are that function's
    (dropout_p, dropout_seed, dropout_offset and generator keyword-only here: a seed of None
    with dropout_p > 0 is drawn from `generator` or torch's default generator); numpy
    arguments are taken as constant tensors. Returns a tensor of query's dtype and device (the
    forward's path is `path`; the backward runs clattn's fused backward and regenerates the
    forward's dropout mask from its seed and offset)."""
    like = _torch.any_tensor(query, key, value)
    query, key, value = (_as_tensor(x, like) for x in (query, key, value))
    attn_mask, sinks = _as_tensor(attn_mask, like), _as_tensor(sinks, like)
    drop = _dropout_args(dropout_p, dropout_seed, dropout_offset, torch_inputs=True,
                         generator=generator, entry="sdpa_autograd")
    p, seed, offset = drop if drop is not None else (0.0, None, 0)
    return SdpaFunction.apply(query, key, value, attn_mask, sinks, bool(is_causal), scale,
                              bool(enable_gqa), ctx, path, p, seed, offset)
