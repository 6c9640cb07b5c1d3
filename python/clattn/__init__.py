"""clattn from Python: attention on OpenCL devices (a thin binding over libclattn).

    import numpy as np, clattn
    out = clattn.scaled_dot_product_attention(q, k, v, is_causal=True)

The functions take PyTorch's argument meanings; see help(clattn.scaled_dot_product_attention).
"""

from ._core import ArgumentError, Context, DeviceError, Error, default_context
from .functional import (paged_attention, quantize, scaled_dot_product_attention,
                         varlen_attention)
from .ring import ring_attention
from .modules import MultiheadAttention
from .onnx import onnx_attention
from .positions import KVCache, positional_encoding, rotary_embedding

__all__ = ["ArgumentError", "Context", "DeviceError", "Error", "KVCache", "MultiheadAttention",
           "default_context", "onnx_attention", "paged_attention", "positional_encoding", "quantize",
           "ring_attention", "rotary_embedding", "scaled_dot_product_attention",
           "varlen_attention"]
__version__ = "0.7.0"
