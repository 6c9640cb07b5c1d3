"""The argument checks and plan helpers that every attention entry shares (SDPA, the serving
calls, varlen, flash_attn, ONNX, the KV cache): dtypes, sinks, score options, dropout fields,
the plan cache's use. Below every entry module: it imports only _lib, _core and dropout."""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import warnings
from typing import NamedTuple, Optional

import numpy as np

from . import _lib
from ._core import ArgumentError, Context, clattn_dtype
from ._lib import lib


_PATHS = {"auto": _lib.PATH_AUTO, "fused": _lib.PATH_FUSED, "unfused": _lib.PATH_UNFUSED}


def _sinks_array(sinks, heads: int) -> Optional[np.ndarray]:
    """Attention sinks as float32 (heads,): finite logits or -inf (no sink); None stays None."""
    if sinks is None:
        return None
    a = np.ascontiguousarray(np.asarray(sinks, dtype=np.float32))
    if a.shape != (heads,):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"sinks has shape {np.shape(sinks)}; expected ({heads},): one logit "
                            f"per query head")
    if np.isnan(a).any() or (a == np.inf).any():
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "sinks: every sink must be a finite logit or -inf (no sink)")
    return a


_warned_float64 = False


def _warn_float64() -> None:
    """Says once per process that float64 inputs are computed in float32 (clattn's kernels
    store f32, f16 and bf16 and compute in float32; the results come back as float64)."""
    global _warned_float64
    if not _warned_float64:
        _warned_float64 = True
        here, level, frame = __file__.rsplit("/", 1)[0], 2, sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(here):
            frame, level = frame.f_back, level + 1  # point at the caller's line
        warnings.warn("clattn computes float64 inputs in float32 (about 1e-7 relative error) "
                      "and returns float64; said once per process", RuntimeWarning,
                      stacklevel=level)


def _as_float(name: str, array) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype == np.float64:
        _warn_float64()
        return a.astype(np.float32)
    try:
        clattn_dtype(a.dtype)
    except TypeError:
        raise TypeError(f"clattn: {name} has dtype {a.dtype}; expected float32, float16, "
                        f"bfloat16 (ml_dtypes) or float64") from None
    return a


def _needs_grad(*xs) -> bool:
    """Whether torch records a graph now and one of xs is a tensor that requires grad (torch
    is already imported when this is asked: a tensor came in)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _check_options(attn_mask, is_causal, scale) -> None:
    if attn_mask is not None and is_causal:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            "attn_mask and is_causal are exclusive (as in PyTorch)")
    if scale is not None and not math.isfinite(scale):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale}: must be finite")


def _set_dropout(desc, drop: Optional[tuple]) -> None:
    """The descriptor's dropout fields from (p, seed, offset); None leaves dropout off."""
    if drop is not None:
        desc.dropout_p, desc.dropout_seed, desc.dropout_offset = drop


class _Score(NamedTuple):
    """The score options of an SDPA call, checked once: what every plan descriptor of the
    numpy, torch and pyopencl paths (forward, forward with lse, backward) takes, and part of
    each plan's cache key."""
    causal: int
    scale: Optional[float]
    softcap: float
    left: int
    right: int
    path: int


def _score(attn_mask, is_causal, scale, softcap=0.0, window_size=(-1, -1),
           path="auto") -> _Score:
    """The options checked (ArgumentError naming the argument) as a _Score."""
    if path not in _PATHS:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"path={path!r}: expected 'auto', 'fused' or 'unfused'")
    _check_options(attn_mask, is_causal, scale)
    try:
        cap = float(softcap)
    except (TypeError, ValueError):
        cap = float("nan")
    if not math.isfinite(cap) or cap < 0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"softcap={softcap!r}: expected a finite number >= 0 (0: off)")
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        left = right = -2
    if left < -1 or right < -1:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"window_size={window_size!r}: expected (left, right), each -1 "
                            f"(unbounded) or >= 0")
    return _Score(_lib.CAUSAL_TOP_LEFT if is_causal else _lib.CAUSAL_NONE,
                  None if scale is None else float(scale), cap, left, right, _PATHS[path])


def _fill(desc, score: _Score, drop: Optional[tuple] = None) -> None:
    """A plan descriptor's score fields from a _Score (the window is top-left aligned, as
    is_causal: query i sees keys i - left .. i + right) and dropout's from drop."""
    desc.causal = score.causal
    desc.scale = float("nan") if score.scale is None else score.scale
    desc.softcap = score.softcap
    if score.left >= 0 or score.right >= 0:
        desc.window_align = _lib.CAUSAL_TOP_LEFT
        desc.window_left, desc.window_right = score.left, score.right
    desc.path = score.path
    _set_dropout(desc, drop)


@contextlib.contextmanager
def _plan_for(ctx: Context, key: tuple, create, drop: Optional[tuple]):
    """The plan for `key`: the context's cached one, or, with dropout (whose seed is part of
    the plan and changes with every training step), one made for this call and released after
    it (the cache would hold a plan per seed and push out the reusable ones)."""
    if drop is None:
        yield ctx.plan(key, create)
        return
    plan = create()
    try:
        yield plan
    finally:
        lib.clattn_plan_release(plan)


def _sdpa_plan(ctx: Context, desc) -> ctypes.c_void_p:
    """An SDPA plan from a filled descriptor (raises clattn's error with its message)."""
    plan = ctypes.c_void_p()
    ctx.check(lib.clattn_sdpa_plan_create(ctx.handle, ctypes.byref(desc), ctypes.byref(plan)))
    return plan


def _is_pyopencl(x) -> bool:
    return type(x).__module__.startswith("pyopencl") and hasattr(x, "queue")


def _fp8_scales(kv_dtype, k_scale, v_scale) -> tuple:
    """(k_scale, v_scale) as the C API takes them (0: 1): finite and > 0, given only with an
    fp8 kv_dtype (else ArgumentError naming it)."""
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            continue
        if kv_dtype not in _lib.FP8_TYPES:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{name}={s}: a per-tensor scale is for kv_dtype 'fp8_e4m3' or "
                                f"'fp8_e5m2' (got kv_dtype={kv_dtype!r})")
        if not (math.isfinite(s) and s > 0):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"{name}={s}: must be finite and > 0")
    return (float(k_scale or 0.0), float(v_scale or 0.0))
