"""clattn from Python: attention on OpenCL devices (a thin binding over libclattn).

    import numpy as np, clattn
    out = clattn.scaled_dot_product_attention(q, k, v, is_causal=True)

The functions take PyTorch's argument meanings; see help(clattn.scaled_dot_product_attention).
"""

from ._core import ArgumentError, Context, DeviceError, Error, default_context
from .dropout import dropout_mask
from .functional import (SdpaGrads, paged_attention, quantize, scaled_dot_product_attention,
                         sdpa_backward, sdpa_forward, varlen_attention)
from .ring import ring_attention
from .modules import MultiheadAttention
from .onnx import onnx_attention
from .positions import KVCache, positional_encoding, rotary_embedding

# (and TorchMultiheadAttention, loaded on first use; not in __all__: it needs torch)
__all__ = ["ArgumentError", "Context", "DeviceError", "Error", "KVCache", "MultiheadAttention",
           "default_context", "dropout_mask", "onnx_attention", "paged_attention",
           "positional_encoding", "quantize", "ring_attention", "rotary_embedding",
           "scaled_dot_product_attention", "SdpaGrads", "sdpa_backward", "sdpa_forward",
           "varlen_attention"]
__version__ = "0.8.0"


def __getattr__(name):
    """TorchMultiheadAttention (a torch.nn.Module) is loaded on first use: importing clattn
    does not import torch."""
    if name == "TorchMultiheadAttention":
        from .torch_modules import TorchMultiheadAttention
        return TorchMultiheadAttention
    raise AttributeError(f"module 'clattn' has no attribute {name!r}")
