"""Packed variable-length batches: :func:`varlen_attention`, FlashAttention's
``flash_attn_varlen_func`` on clattn (numpy or torch; differentiable through
clattn._flash_autograd, imported on use)."""

from __future__ import annotations

from typing import Optional

from . import _torch
from ._common import _needs_grad
from ._core import ArrayLike, Context
from ._flash import _flash_forward, _flash_problem, _scale_alias, _varlen_dropout


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
