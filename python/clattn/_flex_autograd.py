"""clattn.flex_attention as a torch.autograd.Function: the forward keeps the rows'
log-sum-exp, the backward runs clattn's backward (clattn_sdpa_backward_plan_create) with the
same user functions (score_mod_grad, the translated d score_mod / d score), auxiliary tensors
and block mask. This module imports torch: numpy users never import it."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import _sdpa_grad, _torch
from .autograd import _as_tensor


class FlexFunction(torch.autograd.Function):
    """apply(query, key, value, spec, scale, enable_gqa, cl_ctx) -> (out, lse): gradients flow
    to query, key and value (with grouped heads, key's and value's sum their group's query
    heads); the captured tensors and lse have none. Once differentiable (no double
    backward)."""

    @staticmethod
    def forward(fctx, query, key, value, spec, scale, enable_gqa, cl_ctx):
        out, lse = _sdpa_grad._sdpa_forward(
            _torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value), None, False,
            scale, enable_gqa, ctx=cl_ctx, _flex=spec)
        out_t = _torch.from_numpy(out, query, query.dtype)
        lse_t = _torch.from_numpy(lse, query)
        fctx.save_for_backward(query, key, value, out_t)
        fctx.set_materialize_grads(False)
        fctx.lse = lse  # numpy float32: nothing for autograd to track
        fctx.options = (spec, scale, enable_gqa, cl_ctx)
        fctx.mark_non_differentiable(lse_t)
        return out_t, lse_t

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out, grad_lse):
        needs = fctx.needs_input_grad
        if grad_out is None:
            return (None,) * 7
        query, key, value, out = fctx.saved_tensors
        spec, scale, enable_gqa, cl_ctx = fctx.options
        g = _sdpa_grad._sdpa_backward(
            _torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
            _torch.to_numpy(out), fctx.lse, _torch.to_numpy(grad_out.contiguous()), None, False,
            scale, enable_gqa, ctx=cl_ctx, _flex=spec)
        grads = [_torch.from_numpy(t, like, like.dtype) if need else None
                 for t, like, need in zip(g, (query, key, value), needs[:3])]
        return (*grads, None, None, None, None)


def flex_autograd(query, key, value, spec, scale, enable_gqa, ctx):
    """(out, lse) through :class:`FlexFunction`; numpy arguments are constant tensors."""
    like = _torch.any_tensor(query, key, value)
    query, key, value = (_as_tensor(x, like) for x in (query, key, value))
    return FlexFunction.apply(query, key, value, spec, scale, bool(enable_gqa), ctx)
