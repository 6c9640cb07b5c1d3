"""Torch tensors in, torch tensors out, with no copy beyond what the device transfer needs.

torch is never imported here unless a caller already has: a torch tensor can only exist once
torch is in sys.modules, so ``is_tensor`` looks there and costs numpy users nothing."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def compiling() -> bool:
    """Whether torch.compile is tracing now (then clattn's torch entry points go through the
    custom operators of clattn.ops)."""
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def any_tensor(*xs: Any) -> Any:
    """The first torch tensor among xs, or None."""
    for x in xs:
        if is_tensor(x):
            return x
    return None


def to_numpy(x: Any) -> Any:
    """A torch tensor as a numpy array over the same memory (a CPU tensor is not copied, any
    strides; a tensor on another device is copied to the host once); anything else as is.
    bfloat16 comes out as ml_dtypes.bfloat16 (the bits reinterpreted, no conversion)."""
    if not is_tensor(x):
        return x
    import torch
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("clattn: a bfloat16 torch tensor needs ml_dtypes "
                            "(pip install ml_dtypes)") from None
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: Any, like: Any, dtype: Any = None) -> Any:
    """The numpy result a as a torch tensor over the same memory, in dtype (default: a's own)
    and on like's device (the one copy a non-CPU device needs)."""
    if a is None:
        return None
    import torch
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a if a.flags.writeable else a.copy())
    want = t.dtype if dtype is None else dtype
    if t.dtype != want or t.device != like.device:
        t = t.to(device=like.device, dtype=want)
    return t
