"""Torch tensors in, torch tensors out, with no copy beyond what the device transfer needs.

torch is never imported here unless a caller already has: a torch tensor can only exist once
torch is in sys.modules, so ``is_tensor`` looks there and costs numpy users nothing."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

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
    if t.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        return t.view(torch.uint8).numpy()  # the codes (fp8_kv_dtype names the format)
    if t.dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("clattn: a bfloat16 torch tensor needs ml_dtypes "
                            "(pip install ml_dtypes)") from None
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def fp8_kv_dtype(*xs: Any) -> Any:
    """'fp8_e4m3' or 'fp8_e5m2' when the first of xs that is a torch tensor is
    torch.float8_e4m3fn or torch.float8_e5m2 (torch 2.1+), else None."""
    for x in xs:
        if is_tensor(x):
            import torch
            names = {getattr(torch, "float8_e4m3fn", None): "fp8_e4m3",
                     getattr(torch, "float8_e5m2", None): "fp8_e5m2"}
            return names.get(x.dtype) if x.dtype is not None else None
    return None


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


def _requires_grad(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled() and isinstance(x, torch.Tensor) and \
        x.requires_grad


def _to_torch(result: Any, like: Any) -> Any:
    """A numpy result (or a tuple, list or dict of them, or anything with a ``_map``) as torch
    tensors of the same dtypes (clattn's results already have their inputs' dtypes; lse is
    float32, quantized blocks uint8) on like's device."""
    if hasattr(result, "_map"):
        return result._map(lambda v: _to_torch(v, like))
    if isinstance(result, dict):
        return {k: _to_torch(v, like) for k, v in result.items()}
    if isinstance(result, (tuple, list)):
        return type(result)(_to_torch(v, like) for v in result)
    if isinstance(result, np.ndarray):
        return from_numpy(result, like)
    return result


def torch_io(name: str) -> Callable:
    """Torch tensors in, torch tensors out for a function computed on numpy arrays: tensor
    arguments are read as numpy views, the results come back as tensors (of the dtypes the
    numpy results have) on the first tensor argument's device. Such a function has no backward: on tensors that
    require grad it raises TypeError naming it (never a detached result)."""
    def wrap(function: Callable) -> Callable:
        @functools.wraps(function)
        def call(*args, **kwargs):
            like = any_tensor(*args, *kwargs.values())
            if like is None:
                return function(*args, **kwargs)
            if any(_requires_grad(a) for a in (*args, *kwargs.values())):
                raise TypeError(f"clattn.{name} is not differentiable and an argument "
                                f"requires grad: call it under torch.no_grad() or on "
                                f"detached tensors")
            result = function(*(to_numpy(a) for a in args),
                              **{k: to_numpy(v) for k, v in kwargs.items()})
            return _to_torch(result, like)
        return call
    return wrap
