"""clattn.MultiheadAttention: a trainable torch.nn.Module with nn.MultiheadAttention's
constructor, parameters, defaults and call, whose attention core is clattn's (forward and
backward on the clattn device). This module imports torch; ``clattn.MultiheadAttention`` (and
its old name ``clattn.TorchMultiheadAttention``) loads it on first use. Numpy users without
torch: ``clattn.NumpyMultiheadAttention``."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from . import _lib
from ._core import ArgumentError, Context
from .dropout import _probability
from ._sdpa_entry import scaled_dot_product_attention


class MultiheadAttention(nn.Module):
    """``torch.nn.MultiheadAttention``, a drop-in, with clattn's attention in the middle.

    The parameters are nn.MultiheadAttention's, under its names, so ``load_state_dict`` works
    both ways between the two: in_proj_weight (3E, E) and in_proj_bias (3E,) (packed q, k, v;
    q_proj_weight, k_proj_weight, v_proj_weight when kdim or vdim differ from embed_dim) and
    out_proj (an nn.Linear(E, E)); initialised as torch initialises them. They are ordinary
    torch parameters (any optimizer trains them): the projections run in torch, the
    attention runs through ``clattn.scaled_dot_product_attention``, whose backward is clattn's
    (clattn.autograd), computed in float32.

    embed_dim, num_heads, bias, kdim, vdim, batch_first (default False: (L, N, E) inputs),
    device, dtype: as in torch. dropout: attention dropout on the weights, as torch's (in
    [0, 1]; only in training mode, ``module.train()``, the default; ``eval()`` turns it off),
    each call drawing its seed from torch's default generator (``torch.manual_seed`` repeats
    runs; the backward regenerates the forward's mask; see scaled_dot_product_attention's
    dropout_p). add_bias_kv and add_zero_attn must be False (ArgumentError otherwise). ctx,
    path (keyword only): the clattn.Context and the forward's path (see
    scaled_dot_product_attention).

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (output, weights): torch's arguments,
    defaults and mask conventions (attn_mask (L, S) or (N * num_heads, L, S), bool True = may
    NOT attend, or float added to the scores; key_padding_mask (N, S), bool True = ignore
    that key, or float added); is_causal=True with no attn_mask is causal masking. Unbatched
    (L, E) inputs work. need_weights=True (torch's default) also returns the attention
    weights, averaged over the heads (N, L, S) or per head (N, num_heads, L, S) with
    average_attn_weights=False, after dropout as torch's; they come from clattn's unfused
    path (a second pass over the scores, as torch's own weights cost): pass
    need_weights=False for the fused kernel alone, and the second result is None. A query
    row whose keys are all masked gives zeros (torch gives NaN).

        mha = clattn.MultiheadAttention(64, 4)
        mha.load_state_dict(torch.nn.MultiheadAttention(64, 4).state_dict())
        out, weights = mha(x, x, x)          # x (L, N, E), as torch's
        out.sum().backward()"""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, device=None, dtype=None, *,
                 ctx: Optional[Context] = None, path: str = "auto"):
        super().__init__()
        if add_bias_kv or add_zero_attn:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                "add_bias_kv and add_zero_attn are not supported")
        self.dropout = _probability(dropout, "dropout")
        if num_heads <= 0 or embed_dim % num_heads != 0:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"embed_dim={embed_dim} must be divisible by "
                                f"num_heads={num_heads}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.batch_first = batch_first
        self.ctx, self.path = ctx, path
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.bias_k = self.bias_v = None  # torch's attributes (add_bias_kv is refused)
        self.add_zero_attn = False
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """torch's nn.MultiheadAttention initialisation (xavier-uniform projections, zero
        biases; out_proj.weight as nn.Linear's)."""
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)

    def _projections(self, query: Tensor, key: Tensor, value: Tensor):
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:e], w[e:2 * e], w[2 * e:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def _mask(self, attn_mask, key_padding_mask, n: int, l: int, s: int):
        """torch's attn_mask and key_padding_mask as one mask for clattn's SDPA, (N or 1, H or
        1, L, S): bool (True = takes part) when both are bool, else float (added)."""
        h = self.num_heads
        parts = []
        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if tuple(attn_mask.shape) != (l, s):
                    raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                        f"attn_mask has shape {tuple(attn_mask.shape)}; "
                                        f"expected ({l}, {s}) or ({n * h}, {l}, {s})")
                parts.append(attn_mask.view(1, 1, l, s))
            elif attn_mask.dim() == 3 and tuple(attn_mask.shape) == (n * h, l, s):
                parts.append(attn_mask.view(n, h, l, s))
            else:
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"attn_mask has shape {tuple(attn_mask.shape)}; expected "
                                    f"({l}, {s}) or ({n * h}, {l}, {s})")
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (n, s):
                raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                    f"key_padding_mask has shape "
                                    f"{tuple(key_padding_mask.shape)}; expected ({n}, {s})")
            parts.append(key_padding_mask.view(n, 1, 1, s))
        if not parts:
            return None
        if all(p.dtype == torch.bool for p in parts):
            keep = ~parts[0]
            for p in parts[1:]:
                keep = keep & ~p
            return keep
        total = None
        for p in parts:
            if p.dtype == torch.bool:
                p = torch.zeros(p.shape, dtype=torch.float32, device=p.device).masked_fill(
                    p, float("-inf"))
            total = p if total is None else total + p
        return total

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        n, l, _ = query.shape
        s = key.shape[1]
        h, d = self.num_heads, self.head_dim
        q, k, v = self._projections(query, key, value)
        q, k, v = (x.view(n, -1, h, d).transpose(1, 2) for x in (q, k, v))  # (N, H, L, d)
        mask = self._mask(attn_mask, key_padding_mask, n, l, s)
        causal = bool(is_causal) and mask is None
        attn = scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                            dropout_p=self.dropout if self.training else 0.0,
                                            is_causal=causal, ctx=self.ctx, path=self.path,
                                            need_weights=bool(need_weights))
        weights = None
        if need_weights:
            attn, weights = attn  # (N, H, L, S)
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if not batched:
                weights = weights.squeeze(0)
        out = self.out_proj(attn.transpose(1, 2).reshape(n, l, self.embed_dim))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


TorchMultiheadAttention = MultiheadAttention  # the name before 0.8
