"""Contexts, errors and device buffers: the layer every Python entry point stands on."""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Any, Optional

import numpy as np

from . import _lib
from ._lib import cl, lib


class Error(Exception):
    """A clattn call failed. ``status`` is the library's code (or OpenCL's, passed through),
    ``status_name`` its name, and the message is the library's own (clattn_last_error)."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.status_name = lib.clattn_status_string(status).decode()
        super().__init__(f"{self.status_name}: {message}")


class ArgumentError(Error, ValueError):
    """Bad arguments: shapes, dtypes, options (CLATTN_ERR_INVALID_ARGUMENT, _INVALID_SHAPE,
    _OVERFLOW, _TOO_LARGE, _BUFFER_TOO_SMALL)."""


class DeviceError(Error, RuntimeError):
    """The device or the OpenCL runtime failed, or cannot run the request (no device, a kernel
    build failure, CLATTN_ERR_UNSUPPORTED, an OpenCL error code)."""


_PTR = ctypes.sizeof(ctypes.c_void_p)
_ARGUMENT_STATUSES = {_lib.ERR_INVALID_ARGUMENT, _lib.ERR_INVALID_SHAPE, _lib.ERR_OVERFLOW,
                      _lib.ERR_TOO_LARGE, _lib.ERR_BUFFER_TOO_SMALL}


def _raise(status: int, message: str) -> None:
    cls = ArgumentError if status in _ARGUMENT_STATUSES else DeviceError
    raise cls(status, message)


class Context:
    """An OpenCL device, context and queue for clattn (clattn_ctx).

    ``device``: None (the environment variable CLATTN_DEVICE, else the first GPU, else the
    first CPU device), ``"gpu"``, ``"cpu"`` or ``"P:D"`` (platform P, device D, as
    ``clattn devices`` lists them). Use :meth:`from_pyopencl` to run on a pyopencl queue.
    Calls on one context are serialised by a lock (the C library's contexts are not
    thread-safe)."""

    def __init__(self, device: Optional[str] = None):
        self._handle = ctypes.c_void_p()
        message = ctypes.create_string_buffer(1024)
        spec = device.encode() if device else None
        status = lib.clattn_ctx_create(spec, ctypes.byref(self._handle), message, len(message))
        if status != _lib.SUCCESS:
            _raise(status, message.value.decode(errors="replace"))
        self._init_common()

    @classmethod
    def from_pyopencl(cls, queue: Any) -> "Context":
        """A context that enqueues on a pyopencl ``CommandQueue`` (its context and device are
        used; clattn retains the queue). pyopencl arrays of that context are then read and
        written where they lie."""
        self = cls.__new__(cls)
        self._handle = ctypes.c_void_p()
        message = ctypes.create_string_buffer(1024)
        status = lib.clattn_ctx_create_from_queue(ctypes.c_void_p(queue.int_ptr),
                                                  ctypes.byref(self._handle), message,
                                                  len(message))
        if status != _lib.SUCCESS:
            _raise(status, message.value.decode(errors="replace"))
        self._init_common()
        self._pyopencl_queue = queue
        return self

    def _init_common(self) -> None:
        self.lock = threading.RLock()
        self._plans: "OrderedDict[tuple, ctypes.c_void_p]" = OrderedDict()

    @property
    def handle(self) -> ctypes.c_void_p:
        if not self._handle:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, "the context is closed")
        return self._handle

    @property
    def device_name(self) -> str:
        device = lib.clattn_ctx_device(self.handle)
        size = ctypes.c_size_t()
        cl.clGetDeviceInfo(device, _lib.CL_DEVICE_NAME, 0, None, ctypes.byref(size))
        name = ctypes.create_string_buffer(size.value or 1)
        cl.clGetDeviceInfo(device, _lib.CL_DEVICE_NAME, size.value, name, None)
        return name.value.decode(errors="replace")

    def check(self, status: int) -> None:
        """Raises the library's error for a failed status, with the context's message."""
        if status != _lib.SUCCESS:
            message = lib.clattn_last_error(self._handle) if self._handle else b""
            _raise(status, (message or b"").decode(errors="replace"))

    def plan(self, key: tuple, create) -> Any:
        """The cached entry for `key`, or create()'s (a plan handle, or an object with a
        release() method such as :class:`Prepared`); at most 64 entries are kept, the least
        recently used released first."""
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        plan = create()
        self.store(key, plan)
        return plan

    def lookup(self, key: tuple) -> Any:
        """The cached entry for `key` (marked as recently used), or None."""
        entry = self._plans.get(key)
        if entry is not None:
            self._plans.move_to_end(key)
        return entry

    def store(self, key: tuple, entry: Any) -> None:
        """Caches `entry` under `key` (the cache owns it from then on)."""
        old = self._plans.pop(key, None)
        if old is not None and old is not entry:
            _release_entry(old)
        self._plans[key] = entry
        while len(self._plans) > 64:
            _, old = self._plans.popitem(last=False)
            _release_entry(old)

    def take(self, key: tuple) -> Any:
        """Removes `key`'s entry from the cache without releasing it (the caller owns it)."""
        return self._plans.pop(key, None)

    def close(self) -> None:
        """Releases the plans and the context (idempotent)."""
        plans, self._plans = getattr(self, "_plans", {}), OrderedDict()
        for plan in plans.values():
            _release_entry(plan)
        if getattr(self, "_handle", None):
            lib.clattn_ctx_release(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _release_entry(entry: Any) -> None:
    if isinstance(entry, ctypes.c_void_p):
        lib.clattn_plan_release(entry)
    else:
        entry.release()


class Prepared:
    """A plan with its tensors bound, for repeated calls of one shape: numpy inputs are written
    into staging buffers kept with the plan (no buffer made per call), the output is read from
    one, and only those copies and the execution happen per call. Owned by a Context's cache
    (the context's lock serialises its use).

    inputs: the tensor roles, in the order run() takes the arrays; their layouts in `tensors`
    are bound to staging buffers of `nbytes` each. out_role: the role read back into a new
    array of out_shape/out_dtype."""

    def __init__(self, ctx: Context, plan: ctypes.c_void_p, tensors: "_lib.Tensors",
                 inputs, out_role: str, out_shape, out_dtype):
        self.plan = plan
        self.tensors = tensors
        self.buffers = []
        self.staging = []
        self.queue = lib.clattn_ctx_queue(ctx.handle)
        for role, nbytes in inputs:
            buffer = Buffer(ctx, nbytes=nbytes)
            self.buffers.append(buffer)
            self.staging.append((buffer.mem, nbytes))
            getattr(tensors, role).mem = buffer.mem
        self.out_dtype = np.dtype(out_dtype)
        self.out_shape = tuple(out_shape)
        out_nbytes = int(np.prod(self.out_shape)) * self.out_dtype.itemsize
        self.out_buffer = Buffer(ctx, nbytes=out_nbytes)
        getattr(tensors, out_role).mem = self.out_buffer.mem
        self.out_nbytes = out_nbytes

    def run(self, ctx: Context, arrays) -> np.ndarray:
        """Writes arrays (C-contiguous, the staging sizes) in order, executes, and returns the
        output read back. The writes, the kernels and the read are ordered by events (any
        queue); the read blocks, so the arrays may be reused once this returns."""
        queue = self.queue
        events = (ctypes.c_void_p * (len(arrays) + 1))()
        written = 0
        out = np.empty(self.out_shape, self.out_dtype)
        try:
            for (mem, nbytes), array in zip(self.staging, arrays):
                status = cl.clEnqueueWriteBuffer(queue, mem, 0, 0, nbytes, array.ctypes.data, 0,
                                                 None, ctypes.byref(events, written * _PTR))
                if status != 0:
                    _raise(status, f"clEnqueueWriteBuffer failed with {status}")
                written += 1
            ctx.check(lib.clattn_plan_execute(self.plan, ctypes.byref(self.tensors),
                                              _lib.ROLE_COUNT, None, None, written, events,
                                              ctypes.byref(events, written * _PTR)))
            done = ctypes.byref(events, written * _PTR)
            written += 1
            status = cl.clEnqueueReadBuffer(queue, self.out_buffer.mem, 1, 0, self.out_nbytes,
                                            out.ctypes.data, 1, done, None)
            if status != 0:
                _raise(status, f"clEnqueueReadBuffer failed with {status}")
        except BaseException:
            lib.clattn_finish(ctx.handle)  # no pending write may outlive its array
            raise
        finally:
            for i in range(written):
                cl.clReleaseEvent(events[i])
        return out

    def release(self) -> None:
        if self.plan:
            lib.clattn_plan_release(self.plan)
            self.plan = None
        self.buffers = []
        self.out_buffer = None


_default: Optional[Context] = None
_default_lock = threading.Lock()


def default_context() -> Context:
    """The context used when a call gets ``ctx=None`` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Context()
        return _default


# An array argument: a numpy array (or anything np.asarray takes), or a pyopencl.array.Array.
ArrayLike = Any

# --- dtypes and device buffers ----------------------------------------------------------------

def _bfloat16():
    try:
        import ml_dtypes  # optional: numpy has no bfloat16 of its own
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None


BFLOAT16 = _bfloat16()


def clattn_dtype(dtype: np.dtype) -> int:
    """The clattn storage type of a numpy float dtype."""
    if dtype == np.float32:
        return _lib.F32
    if dtype == np.float16:
        return _lib.F16
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return _lib.BF16
    raise TypeError(f"clattn: dtype {dtype} is not float32, float16 or bfloat16 (float64 "
                    f"inputs are computed in float32)")


class Buffer:
    """A device buffer created from (or for) a numpy array, released when collected."""

    def __init__(self, ctx: Context, array: Optional[np.ndarray] = None, nbytes: int = 0,
                 writable: bool = False):
        """array: the buffer's contents (read-only to kernels unless writable); else nbytes
        uninitialised (read-write)."""
        err = ctypes.c_int32(0)
        context = lib.clattn_ctx_cl_context(ctx.handle)
        if array is not None:
            data = np.ascontiguousarray(array)
            nbytes = max(data.nbytes, 1)
            access = _lib.CL_MEM_READ_WRITE if writable else _lib.CL_MEM_READ_ONLY
            self.mem = cl.clCreateBuffer(context, access | _lib.CL_MEM_COPY_HOST_PTR,
                                         nbytes, data.ctypes.data_as(ctypes.c_void_p),
                                         ctypes.byref(err))
        else:
            self.mem = cl.clCreateBuffer(context, _lib.CL_MEM_READ_WRITE, max(nbytes, 1), None,
                                         ctypes.byref(err))
        if err.value != 0 or not self.mem:
            _raise(err.value or _lib.ERR_HOST_MEMORY,
                   f"clCreateBuffer({nbytes} bytes) failed with {err.value}")

    def read(self, ctx: Context, out: np.ndarray) -> None:
        status = cl.clEnqueueReadBuffer(lib.clattn_ctx_queue(ctx.handle), self.mem, 1, 0,
                                        out.nbytes, out.ctypes.data_as(ctypes.c_void_p), 0, None,
                                        None)
        if status != 0:
            _raise(status, f"clEnqueueReadBuffer failed with {status}")

    def __del__(self) -> None:
        if getattr(self, "mem", None):
            cl.clReleaseMemObject(self.mem)
            self.mem = None


def layout(dtype: int, shape, strides=None) -> _lib.Tensor:
    """A clattn_tensor layout (no buffer yet): shape of rank 1..4, strides in elements (None:
    packed)."""
    t = _lib.Tensor()
    t.dtype = dtype
    t.rank = len(shape)
    step = 1
    for i in reversed(range(len(shape))):
        t.dims[i] = int(shape[i])
        t.strides[i] = int(strides[i]) if strides is not None else step
        step *= int(shape[i])
    return t
