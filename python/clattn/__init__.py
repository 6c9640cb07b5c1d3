"""clattn from Python: attention on OpenCL devices (a thin binding over libclattn).

    import numpy as np, clattn
    out = clattn.scaled_dot_product_attention(q, k, v, is_causal=True)

The functions take PyTorch's argument meanings; see help(clattn.scaled_dot_product_attention).
Torch users: torch tensors in give torch tensors out, with autograd; clattn.MultiheadAttention
is an nn.Module; clattn.flash_attn has flash-attn's functions; clattn.transformers.register()
makes clattn an attention implementation of Hugging Face transformers.
clattn.flex_attention and clattn.create_block_mask are PyTorch's FlexAttention (score_mod and
mask_mod Python functions translated into OpenCL C), on numpy arrays or torch tensors.
"""

import importlib as _importlib

from ._core import ArgumentError, Context, DeviceError, Error, default_context
from .doctor import doctor, validations
from .dropout import dropout_mask
from .flex import BlockMask, create_block_mask, flex_attention, last_tiles_visited
from .functional import (SdpaGrads, paged_attention, quantize, scaled_dot_product_attention,
                         sdpa_backward, sdpa_forward, varlen_attention)
from .ring import ring_attention
from .modules import NumpyMultiheadAttention
from .onnx import onnx_attention
from .positions import KVCache, positional_encoding, rotary_embedding

# Loaded on first use, so that importing clattn does not import torch: the torch modules
# (MultiheadAttention, an nn.Module, and its old name TorchMultiheadAttention) and the
# submodules for torch users.
_TORCH_CLASSES = ("MultiheadAttention", "TorchMultiheadAttention")
_SUBMODULES = ("autograd", "flash_attn", "transformers", "ops")

# (not the torch-only names: `from clattn import *` must work without torch)
__all__ = ["ArgumentError", "BlockMask", "Context", "DeviceError", "Error", "KVCache",
           "NumpyMultiheadAttention", "create_block_mask", "default_context", "doctor",
           "dropout_mask", "flex_attention", "last_tiles_visited", "onnx_attention",
           "paged_attention", "positional_encoding", "quantize", "ring_attention", "rotary_embedding", "scaled_dot_product_attention",
           "SdpaGrads", "sdpa_backward", "sdpa_forward", "validations", "varlen_attention"]
__version__ = "0.12.0"


def __getattr__(name):
    if name in _TORCH_CLASSES:
        try:
            from . import torch_modules
        except ImportError as e:
            raise ImportError(f"clattn.{name} is a torch.nn.Module and needs torch ({e}); "
                              f"without torch use clattn.NumpyMultiheadAttention") from e
        return getattr(torch_modules, name)
    if name in _SUBMODULES:
        try:
            return _importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}":
                raise AttributeError(f"module 'clattn' has no attribute {name!r}") from None
            raise
    raise AttributeError(f"module 'clattn' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_TORCH_CLASSES) | set(_SUBMODULES))
