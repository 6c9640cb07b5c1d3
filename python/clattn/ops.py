"""clattn's attention as torch custom operators (``torch.library.custom_op``, torch >= 2.4), so
that ``torch.compile`` graphs call clattn without a graph break: ``torch.ops.clattn.sdpa``
(forward, with the rows' log-sum-exp) and ``torch.ops.clattn.sdpa_backward``, each with a fake
(meta) implementation that gives the result shapes, and autograd registered between them.

``clattn.scaled_dot_product_attention`` on torch tensors goes through these operators by
itself while torch.compile traces it (torch.compiler.is_compiling()); ``sdpa`` here is the
same call made directly. Dropout and the weights output are not operators (refused while
compiling). This module imports torch; ``clattn.ops`` loads it on first use."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib, _sdpa_grad, _torch
from ._core import ArgumentError

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"clattn.ops needs torch.library.custom_op (torch >= 2.4); this is torch "
                      f"{torch.__version__}")


def _result_shapes(query: Tensor, key: Tensor, value: Tensor):
    """(out, lse) shapes of an SDPA call, broadcast batch dims included."""
    if query.dim() < 3:
        return (query.shape[-2], value.shape[-1]), (query.shape[-2],)
    batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    out = tuple(batch) + (query.shape[-3], query.shape[-2], value.shape[-1])
    return out, out[:-1]


@torch.library.custom_op("clattn::sdpa", mutates_args=())
def _sdpa_op(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
             sinks: Optional[Tensor], is_causal: bool, scale: Optional[float], enable_gqa: bool,
             softcap: float, window_left: int, window_right: int,
             path: str) -> Tuple[Tensor, Tensor]:
    out, lse = _sdpa_grad.sdpa_forward(
        _torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
        _torch.to_numpy(attn_mask), is_causal, scale, enable_gqa, sinks=_torch.to_numpy(sinks),
        path=path, softcap=softcap, window_size=(window_left, window_right))
    return (_torch.from_numpy(out, query, query.dtype),
            _torch.from_numpy(lse, query, torch.float32))


@_sdpa_op.register_fake
def _(query, key, value, attn_mask, sinks, is_causal, scale, enable_gqa, softcap, window_left,
      window_right, path):
    out, lse = _result_shapes(query, key, value)
    return query.new_empty(out), query.new_empty(lse, dtype=torch.float32)


@torch.library.custom_op("clattn::sdpa_backward", mutates_args=())
def _sdpa_backward_op(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor,
                      lse: Tensor, attn_mask: Optional[Tensor], sinks: Optional[Tensor],
                      is_causal: bool, scale: Optional[float], enable_gqa: bool, softcap: float,
                      window_left: int, window_right: int,
                      want_mask_grad: bool) -> List[Tensor]:
    g = _sdpa_grad.sdpa_backward(
        _torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
        _torch.to_numpy(out), _torch.to_numpy(lse), _torch.to_numpy(grad_out.contiguous()),
        _torch.to_numpy(attn_mask), is_causal, scale, enable_gqa, sinks=_torch.to_numpy(sinks),
        want_mask_grad=want_mask_grad, softcap=softcap, window_size=(window_left, window_right))
    grads = [_torch.from_numpy(g[0], query, query.dtype),
             _torch.from_numpy(g[1], key, key.dtype),
             _torch.from_numpy(g[2], value, value.dtype)]
    if want_mask_grad:
        grads.append(_torch.from_numpy(g.grad_attn_mask, attn_mask, attn_mask.dtype))
    if sinks is not None:
        grads.append(_torch.from_numpy(g.grad_sinks, sinks, sinks.dtype))
    return grads


@_sdpa_backward_op.register_fake
def _(grad_out, query, key, value, out, lse, attn_mask, sinks, is_causal, scale, enable_gqa,
      softcap, window_left, window_right, want_mask_grad):
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)]
    if want_mask_grad:
        grads.append(torch.empty_like(attn_mask))
    if sinks is not None:
        grads.append(torch.empty_like(sinks))
    return grads


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, sinks, *options = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, attn_mask, sinks)
    ctx.options = options


def _backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse, attn_mask, sinks = ctx.saved_tensors
    is_causal, scale, enable_gqa, softcap, left, right, _path = ctx.options
    needs = ctx.needs_input_grad
    want_mask = attn_mask is not None and needs[3] and attn_mask.dtype != torch.bool
    grads = torch.ops.clattn.sdpa_backward(grad_out, query, key, value, out, lse, attn_mask,
                                           sinks, is_causal, scale, enable_gqa, softcap, left,
                                           right, want_mask)
    dq, dk, dv = grads[:3]
    rest = list(grads[3:])
    dmask = rest.pop(0) if want_mask else None
    dsinks = rest.pop(0) if sinks is not None else None
    return (dq, dk, dv, dmask, dsinks if sinks is not None and needs[4] else None,
            None, None, None, None, None, None, None)


torch.library.register_autograd("clattn::sdpa", _backward, setup_context=_setup_context)


def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
         enable_gqa: bool = False, *, sinks: Optional[Tensor] = None, softcap: float = 0.0,
         window_size=(-1, -1), path: str = "auto") -> Tensor:
    """``clattn.scaled_dot_product_attention`` on torch tensors through the custom operator
    ``torch.ops.clattn.sdpa`` (traceable by torch.compile, differentiable through
    ``torch.ops.clattn.sdpa_backward``). Dropout is not an operator here: dropout_p must be
    0 (ArgumentError otherwise)."""
    if dropout_p:
        raise ArgumentError(_lib.ERR_UNSUPPORTED,
                            f"dropout_p={dropout_p}: clattn's torch.compile operator has no "
                            f"dropout (call clattn.scaled_dot_product_attention eagerly)")
    left, right = (int(w) for w in window_size)
    out, _ = torch.ops.clattn.sdpa(query, key, value, attn_mask, sinks, bool(is_causal), scale,
                                   bool(enable_gqa), float(softcap), left, right, path)
    return out
