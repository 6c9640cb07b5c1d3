"""clattn.scaled_dot_product_attention, the public SDPA entry: it routes a call to the torch
custom operator while torch.compile traces (clattn.ops), to the autograd Function where torch
records gradients (clattn.autograd), else to the numpy, torch-view and pyopencl paths below
(_sdpa). It is the one module that imports autograd and ops (on use): they import _sdpa and
_sdpa_grad, never this module."""

from __future__ import annotations

from typing import Optional

from . import _lib, _torch
from ._common import _needs_grad
from ._core import ArgumentError, ArrayLike, Context
from ._sdpa import checked_options, run_checked


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
        return _compiled(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                         sinks, softcap, window_size, path, need_weights)
    like, drop, sc = checked_options(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                     softcap, window_size, path, need_weights, dropout_seed,
                                     dropout_offset, generator)
    if like is not None and _needs_grad(query, key, value, attn_mask, sinks):
        from .autograd import sdpa_autograd  # torch autograd: the forward keeps its lse
        p, seed, offset = drop if drop is not None else (0.0, None, 0)
        return sdpa_autograd(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                             sinks=sinks, ctx=ctx, path=path, dropout_p=p, dropout_seed=seed,
                             dropout_offset=offset, softcap=softcap, window_size=window_size,
                             need_weights=need_weights)
    return run_checked(query, key, value, attn_mask, is_causal, scale, enable_gqa, ctx, path,
                       sinks, softcap, window_size, need_weights, like, drop, sc)


def _compiled(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sinks,
              softcap, window_size, path, need_weights):
    """Under torch.compile: the call as clattn.ops' custom operator (no weights output)."""
    if need_weights:
        raise ArgumentError(_lib.ERR_UNSUPPORTED, "need_weights=True under torch.compile: "
                            "the weights output is not an operator; call it eagerly")
    from .ops import sdpa
    return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                sinks=sinks, softcap=softcap, window_size=window_size, path=path)
