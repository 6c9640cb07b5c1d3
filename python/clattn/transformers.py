"""clattn as an attention implementation of Hugging Face transformers.

    import clattn.transformers
    name = clattn.transformers.register()          # "clattn"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)
    # or, on a loaded model: model.set_attn_implementation(name)

register() adds an attention function named "clattn" to transformers' ``AttentionInterface``
and, under the same name, transformers' SDPA mask function to ``AttentionMaskInterface``
(without a mask function transformers passes no mask at all to an attention name), so the
masks clattn receives are the boolean (batch, 1, q_len, kv_len) masks transformers builds for
torch's SDPA (True = the key takes part): padding, causal, sliding-window and chunked
patterns all come in them. Where transformers can leave the mask out (no padding, no window
in reach), the call passes is_causal instead and no mask is materialised.

What each attention layer passes reaches clattn: grouped-query heads (enable_gqa, the key
and value heads read where they lie), ``scaling``, ``dropout`` (clattn's dropout, drawn from
torch's generator), ``softcap`` (Gemma 2's logit soft-capping), ``s_aux`` (GPT-OSS's learned
sinks, differentiable), ``position_bias`` (added to the mask as transformers' SDPA path
does). ``output_attentions=True`` returns clattn's attention weights
(scaled_dot_product_attention's need_weights=True: the unfused path; differentiable, but for
soft-capping and dropout).
Tensors that require grad go through clattn's backward (clattn.autograd), so training works.

Differences from "eager": a query row whose keys are all masked (the padded rows of a
left-padded batch) gives zeros where eager gives a uniform average; such rows are padding
and no real token reads them. Importing this module imports transformers and torch."""

from __future__ import annotations

from typing import Optional

import torch

from ._sdpa_entry import scaled_dot_product_attention

NAME = "clattn"

__all__ = ["NAME", "attention_forward", "register"]


def _weights_wanted(kwargs) -> bool:
    """Whether the caller collects the attention weights: transformers' output capturing
    (output_attentions=True) records what the attention function returns, and tells it only
    through its collector (older versions pass output_attentions)."""
    if kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector
        collected = _active_collector.get()
    except (ImportError, LookupError, AttributeError):
        return False
    return isinstance(collected, dict) and "attentions" in collected


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, softcap: Optional[float] = None,
                      s_aux: Optional[torch.Tensor] = None,
                      position_bias: Optional[torch.Tensor] = None, **kwargs):
    """transformers' attention-function interface: query (B, H, L, D), key and value
    (B, Hkv, S, D); attention_mask None, bool (True = take part) or float (added); returns
    (attn_output (B, L, H, Dv), attn_weights (B, H, L, S) or None). sliding_window and the
    other keyword arguments are accepted and need nothing here (the window is in the mask)."""
    q_length = query.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # transformers leaves the mask out where the causal pattern (or none) is all there is:
    # causal prefill (top-left, as clattn's is_causal) or one query row (sees every key)
    is_causal = bool(is_causal) and q_length > 1 and attention_mask is None
    if is_causal and key.shape[2] > q_length:
        # an empty static cache's prefill: the keys past the queries are all masked
        key, value = key[:, :, :q_length], value[:, :, :q_length]
        if position_bias is not None:
            position_bias = position_bias[..., :q_length]
    if position_bias is not None:
        from transformers.integrations.sdpa_attention import create_position_bias_mask
        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal,
                                                   query, key)
        is_causal = False
    if attention_mask is not None and attention_mask.dtype != torch.bool and \
            attention_mask.dtype != query.dtype and attention_mask.is_floating_point():
        attention_mask = attention_mask.to(query.dtype)
    gqa = key.shape[1] != query.shape[1]
    want_weights = _weights_wanted(kwargs)
    result = scaled_dot_product_attention(query, key, value, attention_mask, float(dropout),
                                          is_causal, scaling, gqa, sinks=s_aux,
                                          softcap=float(softcap) if softcap else 0.0,
                                          need_weights=want_weights)
    out, weights = result if want_weights else (result, None)
    return out.transpose(1, 2).contiguous(), weights


def register(name: str = NAME) -> str:
    """Register clattn with transformers under `name` (default "clattn"): the attention
    function in ``AttentionInterface`` and transformers' SDPA mask function in
    ``AttentionMaskInterface``. Returns the name, for ``attn_implementation=`` or
    ``model.set_attn_implementation``. Calling it again is harmless."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
