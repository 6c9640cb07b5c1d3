"""FlashAttention-style attention (clattn.varlen_attention, clattn.flash_attn) as a
torch.autograd.Function: the forward keeps the rows' log-sum-exp, the backward runs clattn's
backward (clattn_sdpa_backward_plan_create) on the same packed or batched problem, with the
dropout mask regenerated from its seed. This module imports torch: numpy users never import
it."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import _flash, _lib, _torch
from ._core import ArgumentError
from .autograd import _as_tensor


def _problem(q, k, v, sinks, args):
    (cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, alibi, drop, cl_ctx,
     entry) = args
    return _flash._flash_problem(
        _torch.to_numpy(q), _torch.to_numpy(k), _torch.to_numpy(v), cu_q, cu_k, max_q, max_k,
        causal, scale, window, softcap, alibi, _torch.to_numpy(sinks), drop, cl_ctx, entry)


class FlashFunction(torch.autograd.Function):
    """apply(q, k, v, sinks, args) -> (out, lse): packed (cu_seqlens in args) or batched
    (B, L, H, D) attention; gradients flow to q, k, v and sinks; lse is not differentiable.
    Once differentiable (no double backward)."""

    @staticmethod
    def forward(fctx, q, k, v, sinks, args):
        out, lse = _flash._flash_forward(_problem(q, k, v, sinks, args), True)
        out_t = _torch.from_numpy(out, q, q.dtype)
        lse_t = _torch.from_numpy(lse, q)
        fctx.save_for_backward(q, k, v, sinks, out_t, lse_t)
        fctx.args = args
        fctx.mark_non_differentiable(lse_t)
        return out_t, lse_t

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out, grad_lse):
        q, k, v, sinks, out, lse = fctx.saved_tensors
        pb = _problem(q, k, v, sinks, fctx.args)
        dq, dk, dv, dsinks = _flash._flash_backward(pb, _torch.to_numpy(out),
                                                         _torch.to_numpy(lse),
                                                         _torch.to_numpy(grad_out))
        needs = fctx.needs_input_grad

        def tensor(g, like, needed):
            return _torch.from_numpy(g, like, like.dtype) if needed and g is not None else None

        return (tensor(dq, q, needs[0]), tensor(dk, k, needs[1]), tensor(dv, v, needs[2]),
                tensor(dsinks, sinks, sinks is not None and needs[3]), None)


def flash_autograd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                   scale, window_size, softcap, alibi_slopes, sinks, drop, ctx,
                   entry: str = "flash_attn"):
    """(out, lse) through :class:`FlashFunction`; numpy arguments are constant tensors."""
    if isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.requires_grad:
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"{entry}: alibi_slopes requires grad, but clattn's backward gives "
                            f"no gradient for the ALiBi slopes (nor does flash-attn's): pass "
                            f"alibi_slopes.detach()")
    like = _torch.any_tensor(q, k, v)
    q, k, v = (_as_tensor(x, like) for x in (q, k, v))
    sinks = _as_tensor(sinks, like)
    if sinks is not None and sinks.dtype != torch.float32:
        sinks = sinks.float()
    args = (_torch.to_numpy(cu_seqlens_q), _torch.to_numpy(cu_seqlens_k), max_seqlen_q,
            max_seqlen_k, bool(causal), scale, tuple(window_size), float(softcap),
            _torch.to_numpy(alibi_slopes), drop, ctx, entry)
    return FlashFunction.apply(q, k, v, sinks, args)
