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

from . import _sdpa, _sdpa_grad, _torch
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


def _weights_graph(query, key, attn_mask, sinks, options):
    """The attention weights in torch's own arithmetic, as a graph over query, key, a float
    attn_mask and sinks: what the backward of clattn's weights output differentiates (the
    values come from clattn; this only carries their gradient)."""
    is_causal, scale, enable_gqa, softcap, (left, right) = options
    q, k = query.float(), key.float()
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    L, S = s.shape[-2], s.shape[-1]
    i = torch.arange(L).view(L, 1)
    j = torch.arange(S).view(1, S)
    keep = torch.ones(L, S, dtype=torch.bool)
    if is_causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.float()
    if sinks is not None:
        sink = sinks.float().view((-1, 1, 1) if s.dim() >= 3 else (1, 1))
        sink = sink.expand(s.shape[:-1] + (1,))
        m = torch.maximum(s.amax(-1, keepdim=True), sink).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        return e / (e.sum(-1, keepdim=True) + torch.exp(sink - m))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


class SdpaFunction(torch.autograd.Function):
    """apply(query, key, value, attn_mask, sinks, is_causal, scale, enable_gqa, ctx, path,
    dropout_p, dropout_seed, dropout_offset, softcap, window_size, need_weights):
    scaled_dot_product_attention with clattn's backward. Gradients flow to query, key, value,
    a float attn_mask and sinks (a bool mask has none); with grouped heads (enable_gqa) the key
    and value gradients sum their group's query heads. Dropout (dropout_p > 0) takes an
    explicit integer dropout_seed: the forward keeps (dropout_p, dropout_seed,
    dropout_offset), never the mask, and the backward regenerates the mask from them. With
    need_weights the result is (out, weights): the weights come from clattn's unfused path
    and their gradient (where one reaches them) from torch's arithmetic of the same weights
    (_weights_graph; not with dropout). Once differentiable (no double backward)."""

    @staticmethod
    def forward(fctx, query, key, value, attn_mask, sinks, is_causal, scale, enable_gqa,
                cl_ctx, path, dropout_p=0.0, dropout_seed=None, dropout_offset=0, softcap=0.0,
                window_size=(-1, -1), need_weights=False):
        dropout = dict(dropout_p=dropout_p, dropout_seed=dropout_seed,
                       dropout_offset=dropout_offset)
        score = dict(softcap=softcap, window_size=window_size)
        arrays = (_torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
                  _torch.to_numpy(attn_mask))
        weights = None
        if path == "unfused":  # no lse there: the backward's unfused path recomputes P whole
            out = _sdpa.sdpa_arrays(
                *arrays, dropout_p, is_causal, scale, enable_gqa, sinks=_torch.to_numpy(sinks),
                ctx=cl_ctx, path=path, dropout_seed=dropout_seed, dropout_offset=dropout_offset,
                need_weights=need_weights, **score)
            if need_weights:
                out, weights = out
            lse = None
        else:
            out, lse = _sdpa_grad.sdpa_forward(
                *arrays, is_causal, scale, enable_gqa, sinks=_torch.to_numpy(sinks),
                ctx=cl_ctx, path=path, **dropout, **score)
            if need_weights:  # a second pass on the unfused path (the same dropout mask)
                weights = _sdpa.sdpa_arrays(
                    *arrays, dropout_p, is_causal, scale, enable_gqa,
                    sinks=_torch.to_numpy(sinks), ctx=cl_ctx, path="unfused",
                    dropout_seed=dropout_seed, dropout_offset=dropout_offset,
                    need_weights=True, **score)[1]
        result = _torch.from_numpy(out, query, query.dtype)
        fctx.save_for_backward(query, key, value, result, attn_mask, sinks)
        fctx.set_materialize_grads(False)
        fctx.lse = lse  # numpy float32: no tensor of the graph, nothing for autograd to track
        fctx.options = (is_causal, scale, enable_gqa, cl_ctx, path)
        fctx.dropout = dropout  # the seed and offset: the backward redraws the same mask
        fctx.score = score
        if weights is None:
            return result
        return result, _torch.from_numpy(weights, query, query.dtype)

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out, grad_weights=None):
        query, key, value, out, attn_mask, sinks = fctx.saved_tensors
        is_causal, scale, enable_gqa, cl_ctx, path = fctx.options
        needs = fctx.needs_input_grad
        want_mask = attn_mask is not None and needs[3] and attn_mask.dtype != torch.bool
        grads = [None] * 5  # query, key, value, attn_mask, sinks
        if grad_out is not None:
            g = _sdpa_grad.sdpa_backward(
                _torch.to_numpy(query), _torch.to_numpy(key), _torch.to_numpy(value),
                _torch.to_numpy(out), fctx.lse, _torch.to_numpy(grad_out.contiguous()),
                _torch.to_numpy(attn_mask), is_causal, scale, enable_gqa,
                sinks=_torch.to_numpy(sinks), ctx=cl_ctx, want_mask_grad=want_mask,
                path="unfused" if path == "unfused" else "auto", **fctx.dropout, **fctx.score)
            for i, (t, like) in enumerate(((g[0], query), (g[1], key), (g[2], value),
                                           (g.grad_attn_mask, attn_mask), (g.grad_sinks, sinks))):
                if t is not None and like is not None:
                    grads[i] = _torch.from_numpy(t, like, like.dtype)
        if grad_weights is not None:
            if fctx.dropout["dropout_p"] > 0:
                raise NotImplementedError(
                    "clattn: the attention weights' gradient with dropout_p > 0 is not "
                    "computed; use the output only, or dropout_p=0")
            inputs = [x.detach().requires_grad_(n) if x is not None else None for x, n in
                      zip((query, key, attn_mask, sinks),
                          (needs[0], needs[1], want_mask, sinks is not None and needs[4]))]
            with torch.enable_grad():
                w = _weights_graph(inputs[0], inputs[1], inputs[2], inputs[3],
                                   (is_causal, scale, enable_gqa, fctx.score["softcap"],
                                    tuple(fctx.score["window_size"])))
                wanted = [(slot, x) for slot, x in zip((0, 1, 3, 4), inputs)
                          if x is not None and x.requires_grad]
                if wanted:
                    got = torch.autograd.grad(w, [x for _, x in wanted],
                                              grad_weights.to(w.dtype), allow_unused=True)
                    for (slot, x), gx in zip(wanted, got):
                        if gx is not None:
                            gx = gx.to(x.dtype)
                            grads[slot] = gx if grads[slot] is None else grads[slot] + gx
        return (grads[0] if needs[0] else None, grads[1] if needs[1] else None,
                grads[2] if needs[2] else None, grads[3] if want_mask else None,
                grads[4] if sinks is not None and needs[4] else None,
                None, None, None, None, None, None, None, None, None, None, None)


def sdpa_autograd(query, key, value, attn_mask=None, is_causal: bool = False,
                  scale: Optional[float] = None, enable_gqa: bool = False, *, sinks=None,
                  ctx: Optional[Context] = None, path: str = "auto", dropout_p: float = 0.0,
                  dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                  generator=None, softcap: float = 0.0, window_size=(-1, -1),
                  need_weights: bool = False):
    """``clattn.scaled_dot_product_attention`` through :class:`SdpaFunction` (differentiable
    in query, key, value, a float attn_mask and sinks). The arguments are that function's
    (dropout_p, dropout_seed, dropout_offset and generator keyword-only here: a seed of None
    with dropout_p > 0 is drawn from `generator` or torch's default generator); numpy
    arguments are taken as constant tensors. Returns a tensor of query's dtype and device, or
    (out, weights) with need_weights (the forward's path is `path`; the backward runs clattn's
    fused backward and regenerates the forward's dropout mask from its seed and offset)."""
    like = _torch.any_tensor(query, key, value)
    query, key, value = (_as_tensor(x, like) for x in (query, key, value))
    attn_mask, sinks = _as_tensor(attn_mask, like), _as_tensor(sinks, like)
    drop = _dropout_args(dropout_p, dropout_seed, dropout_offset, torch_inputs=True,
                         generator=generator, entry="sdpa_autograd")
    p, seed, offset = drop if drop is not None else (0.0, None, 0)
    return SdpaFunction.apply(query, key, value, attn_mask, sinks, bool(is_causal), scale,
                              bool(enable_gqa), ctx, path, p, seed, offset, float(softcap),
                              tuple(window_size), bool(need_weights))
