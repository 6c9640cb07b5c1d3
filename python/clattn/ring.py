"""Ring attention over MPI from Python: libclattn_mpi (clattn_mpi.h) through ctypes, the
communicator from mpi4py. Optional: importing clattn does not import this module, mpi4py or
MPI; ``clattn.ring_attention`` loads them on its first call.

Every rank of the communicator calls ``ring_attention`` with its own rows, in the same order
(the calls are collective); a failure on any rank raises on every rank."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char_p, c_float, c_int, c_longlong, c_size_t,
                    c_void_p)
from typing import Optional

import numpy as np

from . import _lib, _torch
from ._core import (ArgumentError, Buffer, Context, Error, clattn_dtype, default_context,
                    layout)
from ._lib import lib

_LAYOUTS = {"contiguous": 0, "zigzag": 1}
_ALIGN = {"top-left": _lib.CAUSAL_TOP_LEFT, "bottom-right": _lib.CAUSAL_BOTTOM_RIGHT}


class RingDesc(Structure):
    """clattn_ring_desc (clattn_mpi.h); its size is checked against clattn_ring_desc_init's."""
    _fields_ = [("struct_size", c_size_t), ("batch", c_size_t), ("heads", c_size_t),
                ("kv_heads", c_size_t), ("head_dim_qk", c_size_t), ("head_dim_v", c_size_t),
                ("seq_len", c_size_t), ("layout", c_int), ("local_len", c_size_t),
                ("causal", c_int), ("window_align", c_int), ("window_left", c_longlong),
                ("window_right", c_longlong), ("scale", c_float), ("softcap", c_float),
                ("key_padding", c_int), ("kv_seq_len", c_size_t), ("kv_local_len", c_size_t),
                ("dtype", c_int)]


_state = {}


def _mpi_library():
    """libclattn_mpi: $CLATTN_MPI_LIBRARY, else next to libclattn, else the system's, else a
    build tree next to the sources; declared once."""
    if "lib" in _state:
        return _state["lib"]
    paths = [os.environ.get("CLATTN_MPI_LIBRARY"),
             os.path.join(os.path.dirname(lib._name), "libclattn_mpi.so"),
             ctypes.util.find_library("clattn_mpi"),
             os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                           "build", "libclattn_mpi.so"))]
    found = next((p for p in paths if p and os.path.exists(p)), None)
    if found is None and paths[2]:
        found = paths[2]
    if found is None:
        raise ImportError("clattn.ring_attention: libclattn_mpi not found (set CLATTN_MPI_LIBRARY, "
                          "or build it: cmake -S . -B build -DCLATTN_MPI=ON)")
    from mpi4py import MPI  # noqa: F401  (MPI initialised before any clattn_mpi call)
    mpi = ctypes.CDLL(found)
    comm_t = c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(c_void_p) else c_int
    mpi.clattn_ring_desc_init.restype = None
    mpi.clattn_ring_desc_init.argtypes = [POINTER(RingDesc)]
    mpi.clattn_ring_plan_create.restype = c_int
    mpi.clattn_ring_plan_create.argtypes = [c_void_p, comm_t, POINTER(RingDesc),
                                            POINTER(c_void_p), c_char_p, c_size_t]
    mpi.clattn_ring_execute.restype = c_int
    mpi.clattn_ring_execute.argtypes = [c_void_p] + [POINTER(_lib.Tensor)] * 6
    mpi.clattn_ring_plan_release.restype = None
    mpi.clattn_ring_plan_release.argtypes = [c_void_p]
    mpi.clattn_ring_set_sinks.restype = c_int
    mpi.clattn_ring_set_sinks.argtypes = [c_void_p, POINTER(_lib.Tensor)]
    mpi.clattn_ring_last_error.restype = c_char_p
    mpi.clattn_ring_last_error.argtypes = [c_void_p]
    mpi.clattn_mpi_status_string.restype = c_char_p
    mpi.clattn_mpi_status_string.argtypes = [c_int]
    probe = RingDesc()
    mpi.clattn_ring_desc_init(ctypes.byref(probe))
    if probe.struct_size != ctypes.sizeof(RingDesc):
        raise ImportError(f"clattn.ring_attention: {found} has a clattn_ring_desc of "
                          f"{probe.struct_size} bytes, this binding {ctypes.sizeof(RingDesc)}")
    _state.update(lib=mpi, comm_t=comm_t, MPI=MPI)
    return mpi


def _fail(mpi, status: int, message: str):
    name = mpi.clattn_mpi_status_string(status).decode()
    cls = ArgumentError if status in (_lib.ERR_INVALID_ARGUMENT, _lib.ERR_INVALID_SHAPE) else Error
    raise cls(status, f"{name}: {message}")


def ring_attention(q, k, v, comm=None, *, layout_name: str = "contiguous",
                   seq_len: Optional[int] = None, kv_seq_len: Optional[int] = None,
                   causal: bool = False, causal_align: str = "top-left", window=None,
                   scale: Optional[float] = None, softcap: float = 0.0, key_padding=None,
                   sinks=None, return_lse: bool = False, ctx: Optional[Context] = None):
    """Sequence-parallel ("ring") attention over an MPI communicator (mpi4py; default
    COMM_WORLD): each rank passes its own rows and gets its own output rows.

    q (B, H, rows, E), k (B, Hkv, kv_rows, E), v (B, Hkv, kv_rows, Ev): this rank's rows, all
    float32, or all float16 / bfloat16 (ml_dtypes: the ring then runs in that type, its blocks
    travelling at 2 bytes an element); numpy or CPU torch tensors. layout_name "contiguous"
    (rank r holds one block, in rank order; lengths may differ) or "zigzag" (chunks r and
    2N-1-r of 2N: ``clattn_ring_zigzag_rows``). seq_len and kv_seq_len: the whole sequences'
    lengths (None: the sum of the ranks' rows); keys of another length are cross-attention.
    causal and window=(left, right) (-1 unbounded) by global positions, causal_align
    "top-left" or "bottom-right" (the queries at the keys' end). key_padding (B, kv_rows) bool:
    True ignores the key. sinks (H,): attention-sink logits (the same on every rank; -inf is
    none). Returns out (B, H, rows, Ev) in q's dtype, and with return_lse the float32
    log-sum-exp (B, H, rows)."""
    mpi = _mpi_library()
    MPI = _state["MPI"]
    comm = comm if comm is not None else MPI.COMM_WORLD
    like = _torch.any_tensor(q, k, v)
    if like is not None:
        result = ring_attention(
            _torch.to_numpy(q), _torch.to_numpy(k), _torch.to_numpy(v), comm,
            layout_name=layout_name, seq_len=seq_len, kv_seq_len=kv_seq_len, causal=causal,
            causal_align=causal_align, window=window, scale=scale, softcap=softcap,
            key_padding=_torch.to_numpy(key_padding), sinks=_torch.to_numpy(sinks),
            return_lse=return_lse, ctx=ctx)
        if return_lse:
            return _torch.from_numpy(result[0], like), _torch.from_numpy(result[1], like)
        return _torch.from_numpy(result, like)
    ctx = ctx or default_context()
    qa, ka, va = (np.ascontiguousarray(a) for a in (q, k, v))
    if qa.dtype != ka.dtype or qa.dtype != va.dtype:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"q, k and v are {qa.dtype}, {ka.dtype}, {va.dtype}: one type (float32, "
                            f"float16 or bfloat16)")
    dtype = clattn_dtype(qa.dtype)  # raises for other types
    if qa.ndim != 4 or ka.ndim != 4 or va.ndim != 4 or ka.shape[:3] != va.shape[:3] or \
            qa.shape[0] != ka.shape[0] or ka.shape[3] != qa.shape[3]:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"q {qa.shape}, k {ka.shape}, v {va.shape}: expected (B, H, rows, E), "
                            f"(B, Hkv, kv_rows, E), (B, Hkv, kv_rows, Ev)")
    if layout_name not in _LAYOUTS or causal_align not in _ALIGN:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"layout_name={layout_name!r} (contiguous, zigzag), "
                            f"causal_align={causal_align!r} (top-left, bottom-right)")
    B, H, rows, E = qa.shape
    Hkv, kv_rows, Ev = ka.shape[1], ka.shape[2], va.shape[3]
    total_q = comm.allreduce(rows) if seq_len is None else int(seq_len)
    total_k = comm.allreduce(kv_rows) if kv_seq_len is None else int(kv_seq_len)
    pad = None
    if key_padding is not None:
        pad = np.ascontiguousarray(np.asarray(key_padding) != 0, dtype=np.uint8)
        if pad.shape != (B, kv_rows):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"key_padding has shape {np.shape(key_padding)}; expected "
                                f"({B}, {kv_rows})")
    desc = RingDesc()
    mpi.clattn_ring_desc_init(ctypes.byref(desc))
    desc.batch, desc.heads, desc.kv_heads = B, H, Hkv
    desc.head_dim_qk, desc.head_dim_v = E, Ev
    desc.seq_len, desc.local_len = total_q, rows
    desc.kv_seq_len, desc.kv_local_len = total_k, kv_rows
    desc.layout = _LAYOUTS[layout_name]
    align = _ALIGN[causal_align]
    desc.causal = align if causal else _lib.CAUSAL_NONE
    if window is not None:
        desc.window_align, desc.window_left, desc.window_right = align, int(window[0]), \
            int(window[1])
    desc.scale = float("nan") if scale is None else float(scale)
    desc.softcap = float(softcap)
    desc.key_padding = int(pad is not None)
    desc.dtype = dtype
    handle = MPI._handleof(comm)
    message = ctypes.create_string_buffer(1024)
    plan = c_void_p()
    status = mpi.clattn_ring_plan_create(ctx.handle, _state["comm_t"](handle),
                                         ctypes.byref(desc), ctypes.byref(plan), message,
                                         len(message))
    if status != 0:
        _fail(mpi, status, message.value.decode(errors="replace"))
    out = np.empty((B, H, rows, Ev), dtype=qa.dtype)
    lse = np.empty((B, H, rows), dtype=np.float32)
    try:
        with ctx.lock:
            ins = [Buffer(ctx, a) for a in (qa, ka, va)]
            extra = Buffer(ctx, pad) if pad is not None else None
            outs = Buffer(ctx, nbytes=max(out.nbytes, 4)), Buffer(ctx, nbytes=max(lse.nbytes, 4))
            tq, tk, tv = (layout(dtype, a.shape) for a in (qa, ka, va))
            to, tl = layout(dtype, out.shape), layout(_lib.F32, lse.shape)
            tq.mem, tk.mem, tv.mem = (b.mem for b in ins)
            to.mem, tl.mem = outs[0].mem, outs[1].mem
            if sinks is not None:
                from ._common import _sinks_array
                held = _sinks_array(sinks, H)
                sink_buffer = Buffer(ctx, held)
                ts = layout(_lib.F32, held.shape)
                ts.mem = sink_buffer.mem
                status = mpi.clattn_ring_set_sinks(plan, ctypes.byref(ts))
                if status != 0:
                    _fail(mpi, status, mpi.clattn_ring_last_error(plan).decode(errors="replace"))
            tp = _lib.Tensor()
            if extra is not None:
                tp = layout(_lib.U8, pad.shape)
                tp.mem = extra.mem
            status = mpi.clattn_ring_execute(plan, ctypes.byref(tq), ctypes.byref(tk),
                                             ctypes.byref(tv), ctypes.byref(to), ctypes.byref(tl),
                                             ctypes.byref(tp))
            if status != 0:
                _fail(mpi, status, mpi.clattn_ring_last_error(plan).decode(errors="replace"))
            if rows:
                outs[0].read(ctx, out)
                outs[1].read(ctx, lse)
    finally:
        mpi.clattn_ring_plan_release(plan)
    return (out, lse) if return_lse else out
