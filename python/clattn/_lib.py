"""ctypes declarations of libclattn (include/clattn.h) and the few OpenCL calls the binding
needs (buffers for numpy inputs). Layouts mirror the C structs field by field; the library
checks each descriptor's struct_size, so a drift between the two fails loudly, not silently."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32,
                    c_longlong, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p)

MAX_RANK = 4

# clattn_dtype
F32, F16, BF16, U8, I32, Q8_0, Q4_0 = 0, 1, 2, 3, 4, 5, 6
FP8_E4M3, FP8_E5M2 = 7, 8
# llama.cpp's block formats: name -> (clattn dtype, bytes per 32 values)
BLOCK_TYPES = {"q8_0": (Q8_0, 34), "q4_0": (Q4_0, 18)}
# the OCP 8-bit floats (one byte a value, a per-tensor scale): name -> clattn dtype
FP8_TYPES = {"fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}
# clattn_causal
CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT, CAUSAL_ONNX, CAUSAL_OFFSET = 0, 1, 2, 3, 4
# clattn_path
PATH_AUTO, PATH_FUSED, PATH_UNFUSED = 0, 1, 2
# clattn_status
SUCCESS = 0
ERR_INVALID_ARGUMENT = -2048
ERR_INVALID_SHAPE = -2049
ERR_OVERFLOW = -2050
ERR_BUFFER_TOO_SMALL = -2051
ERR_NO_DEVICE = -2052
ERR_BUILD = -2053
ERR_HOST_MEMORY = -2054
ERR_UNSUPPORTED = -2055
ERR_TOO_LARGE = -2056
ERR_UNTRUSTED = -2057  # every variant that could run it failed validation (docs/validation.md)


class Tensor(Structure):
    _fields_ = [("mem", c_void_p), ("offset", c_size_t), ("dtype", c_int), ("rank", c_int),
                ("dims", c_size_t * MAX_RANK), ("strides", c_size_t * MAX_RANK)]


TENSOR_ROLES = ("q", "k", "v", "out", "attn_mask", "key_padding_mask", "weights", "lse",
                "in_proj_weight", "in_proj_bias", "q_weight", "k_weight", "v_weight", "q_bias",
                "k_bias", "v_bias", "out_weight", "out_bias", "kv_seqlen", "past_k", "past_v",
                "present_k", "present_v", "scores", "alibi_slopes", "pos_table", "rope_cos",
                "rope_sin", "position_ids", "score_weight", "sinks", "block_table",
                "cu_seqlens_q", "cu_seqlens_k", "grad_out", "grad_q", "grad_k", "grad_v",
                "grad_attn_mask", "grad_sinks", "flex_aux0", "flex_aux1", "flex_aux2",
                "flex_aux3", "block_mask", "t5_bias")


class Tensors(Structure):
    """clattn_tensors: the role array (by_role) by name."""
    _fields_ = [(name, Tensor) for name in TENSOR_ROLES]


ROLE_COUNT = len(TENSOR_ROLES)  # CLATTN_ROLE_COUNT

# The named defaults of clattn.h (since 0.7; zero no longer means "the default").
KV_HEADS_ALL = ROPE_WHOLE_HEAD = WORKSPACE_UNLIMITED = c_size_t(-1).value
ROPE_BASE_DEFAULT = 10000.0


class _PlanDesc(Structure):
    """A plan descriptor's head (struct_size, by_role, num_roles), and `tensors`: a Tensors the
    descriptor binds through by_role (CLATTN_BIND_ROLES), kept alive with it."""

    @property
    def tensors(self) -> Tensors:
        held = self.__dict__.get("_tensors")
        if held is None:
            held = self.__dict__["_tensors"] = Tensors()
        self.by_role = ctypes.cast(ctypes.pointer(held), POINTER(Tensor))
        self.num_roles = ROLE_COUNT
        return held


_HEAD = [("struct_size", c_size_t), ("by_role", POINTER(Tensor)), ("num_roles", c_size_t)]


FLEX_AUX_MAX = 4
FLEX_SCORE_MOD, FLEX_MASK_MOD, FLEX_SCORE_MOD_GRAD = 1, 2, 4


class FlexDesc(Structure):
    """clattn_flex_desc: user score and mask functions (OpenCL C source) and their tensors."""
    _fields_ = [("source", c_char_p), ("functions", c_uint),
                ("aux_names", c_char_p * FLEX_AUX_MAX), ("block_q", c_size_t),
                ("block_k", c_size_t), ("count_tiles", c_int)]


class BlockMaskDesc(Structure):
    _fields_ = [("struct_size", c_size_t), ("flex", FlexDesc), ("aux", POINTER(Tensor)),
                ("batch", c_size_t), ("heads", c_size_t), ("seq_q", c_size_t),
                ("seq_k", c_size_t), ("out", Tensor)]


class CascadeDesc(Structure):
    """clattn_cascade_desc: a shared-prefix decode step's tensors (python/clattn/cascade.py)."""
    _fields_ = [("struct_size", c_size_t), ("q", Tensor), ("prefix_k", Tensor),
                ("prefix_v", Tensor), ("k", Tensor), ("v", Tensor), ("kv_seqlen", Tensor),
                ("block_table", Tensor), ("out", Tensor), ("lse", Tensor), ("scale", c_float)]


class SdpaDesc(_PlanDesc):
    _fields_ = _HEAD + [("causal", c_int), ("scale", c_float), ("norm", c_int), ("path", c_int),
                        ("softcap", c_float), ("window_align", c_int), ("window_left", c_longlong),
                        ("window_right", c_longlong), ("scores_mode", c_int),
                        ("softmax_f64", c_int), ("rope", c_int), ("rope_style", c_int),
                        ("rope_dims", c_size_t), ("rope_base", c_double), ("rope_start", c_size_t),
                        ("diag_offset", c_longlong), ("max_seqlen_q", c_size_t),
                        ("max_seqlen_k", c_size_t), ("dropout_p", c_double),
                        ("dropout_seed", c_ulonglong), ("dropout_offset", c_ulonglong),
                        ("flex", FlexDesc), ("t5_num_buckets", c_size_t),
                        ("t5_max_distance", c_size_t), ("t5_bidirectional", c_int),
                        ("reserved_", c_int), ("k_scale", c_double), ("v_scale", c_double),
                        ("kv_step", c_int)]


class MhaDesc(_PlanDesc):
    _fields_ = _HEAD + [("num_heads", c_size_t), ("num_kv_heads", c_size_t), ("layout", c_int),
                        ("causal", c_int), ("scale", c_float), ("norm", c_int),
                        ("need_weights", c_int), ("path", c_int), ("softcap", c_float),
                        ("window_align", c_int), ("window_left", c_longlong),
                        ("window_right", c_longlong), ("rope", c_int), ("rope_style", c_int),
                        ("rope_dims", c_size_t), ("rope_base", c_double), ("rope_start", c_size_t)]


class PosencDesc(_PlanDesc):
    _fields_ = _HEAD + [("kind", c_int), ("start", c_size_t), ("base", c_double)]


class RopeDesc(_PlanDesc):
    _fields_ = _HEAD + [("style", c_int), ("rotary_dim", c_size_t), ("base", c_double),
                        ("start", c_size_t)]


class KvCacheDesc(Structure):
    _fields_ = [("struct_size", c_size_t), ("batch", c_size_t), ("kv_heads", c_size_t),
                ("capacity", c_size_t), ("head_dim_qk", c_size_t), ("head_dim_v", c_size_t),
                ("dtype", c_int), ("page_size", c_size_t), ("num_pages", c_size_t),
                ("k_scale", c_double), ("v_scale", c_double)]


class KvCommitDesc(Structure):
    _fields_ = [("struct_size", c_size_t), ("k", Tensor), ("v", Tensor), ("block_table", Tensor),
                ("kv_seqlen", Tensor), ("accepted", Tensor), ("draft_len", c_size_t)]


POSENC_SINUSOIDAL, POSENC_TABLE = 0, 1
ROPE_HALVES, ROPE_PAIRS = 0, 1

# clattn_weight_layout, clattn_need_weights
LAYOUT_XW, LAYOUT_TORCH = 0, 1
WEIGHTS_NONE, WEIGHTS_PER_HEAD, WEIGHTS_AVERAGED = 0, 1, 2


def _library_path() -> str:
    """libclattn: $CLATTN_LIBRARY, else the copy inside the package (wheels), else the
    system's (ldconfig), else a build tree next to the sources."""
    explicit = os.environ.get("CLATTN_LIBRARY")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for name in os.listdir(here):
        if name.startswith("libclattn.so") or name == "libclattn.dylib":
            return os.path.join(here, name)
    found = ctypes.util.find_library("clattn")
    if found:
        return found
    tree = os.path.normpath(os.path.join(here, "..", "..", "build", "libclattn.so"))
    if os.path.exists(tree):
        return tree
    raise ImportError("clattn: libclattn not found (set CLATTN_LIBRARY, install the wheel, "
                      "or build it: cmake -S . -B build && cmake --build build)")


def _opencl_path() -> str:
    explicit = os.environ.get("CLATTN_OPENCL_LIBRARY")
    if explicit:
        return explicit
    return ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"


lib = ctypes.CDLL(_library_path())  # CDLL releases the GIL around every call
cl = ctypes.CDLL(_opencl_path())

_ctx_p = c_void_p
_plan_p = c_void_p


def _declare(function, restype, *argtypes):
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


_declare(lib.clattn_status_string, c_char_p, c_int)
_declare(lib.clattn_ctx_create, c_int, c_char_p, POINTER(_ctx_p), c_char_p, c_size_t)
_declare(lib.clattn_ctx_create_from_queue, c_int, c_void_p, POINTER(_ctx_p), c_char_p, c_size_t)
_declare(lib.clattn_ctx_release, None, _ctx_p)
_declare(lib.clattn_last_error, c_char_p, _ctx_p)
_declare(lib.clattn_ctx_cl_context, c_void_p, _ctx_p)
_declare(lib.clattn_ctx_queue, c_void_p, _ctx_p)
_declare(lib.clattn_ctx_device, c_void_p, _ctx_p)
_declare(lib.clattn_finish, c_int, _ctx_p)
_declare(lib.clattn_sdpa_desc_init, None, POINTER(SdpaDesc))
_declare(lib.clattn_sdpa_plan_create, c_int, _ctx_p, POINTER(SdpaDesc), POINTER(_plan_p))
_declare(lib.clattn_sdpa_backward_plan_create, c_int, _ctx_p, POINTER(SdpaDesc),
         POINTER(_plan_p))
_declare(lib.clattn_dropout_keep, c_int, c_double, c_ulonglong, c_ulonglong, c_size_t, c_size_t)
_declare(lib.clattn_mha_desc_init, None, POINTER(MhaDesc))
_declare(lib.clattn_mha_plan_create, c_int, _ctx_p, POINTER(MhaDesc), POINTER(_plan_p))
_declare(lib.clattn_plan_release, None, _plan_p)
_declare(lib.clattn_posenc_desc_init, None, POINTER(PosencDesc))
_declare(lib.clattn_posenc_plan_create, c_int, _ctx_p, POINTER(PosencDesc), POINTER(_plan_p))
_declare(lib.clattn_rope_desc_init, None, POINTER(RopeDesc))
_declare(lib.clattn_rope_plan_create, c_int, _ctx_p, POINTER(RopeDesc), POINTER(_plan_p))
_declare(lib.clattn_kv_cache_desc_init, None, POINTER(KvCacheDesc))
_declare(lib.clattn_kv_cache_create, c_int, _ctx_p, POINTER(KvCacheDesc), POINTER(c_void_p))
_declare(lib.clattn_kv_cache_release, None, c_void_p)
_declare(lib.clattn_kv_cache_append, c_int, c_void_p, POINTER(Tensor), POINTER(Tensor), c_uint,
         c_void_p, c_void_p)
_declare(lib.clattn_kv_cache_reset, c_int, c_void_p, c_uint, c_void_p, c_void_p)
_declare(lib.clattn_kv_cache_decode, c_int, c_void_p, c_void_p, POINTER(Tensor), POINTER(Tensor),
         c_void_p, c_size_t, c_void_p, c_uint, c_void_p, c_void_p)
_declare(lib.clattn_kv_cache_length, c_size_t, c_void_p)
_declare(lib.clattn_kv_cache_tensors, None, c_void_p, POINTER(Tensor), POINTER(Tensor),
         POINTER(Tensor))
_declare(lib.clattn_kv_cache_block_table, None, c_void_p, POINTER(Tensor))
_declare(lib.clattn_quantize, c_int, _ctx_p, POINTER(Tensor), POINTER(Tensor), c_uint, c_void_p,
         c_void_p)
_declare(lib.clattn_flex_tree_mask, None, POINTER(FlexDesc))
_declare(lib.clattn_kv_commit_desc_init, None, POINTER(KvCommitDesc))
_declare(lib.clattn_kv_commit, c_int, _ctx_p, POINTER(KvCommitDesc), c_uint, c_void_p, c_void_p)
_declare(lib.clattn_quantize_scaled, c_int, _ctx_p, POINTER(Tensor), POINTER(Tensor), c_float,
         c_uint, c_void_p, c_void_p)
_declare(lib.clattn_kv_cache_map_pages, c_int, c_void_p, POINTER(c_int32), c_uint, c_void_p,
         c_void_p)
_declare(lib.clattn_plan_tiles_visited, c_int, _plan_p, c_void_p, POINTER(c_ulonglong),
         POINTER(c_size_t), POINTER(c_size_t))
_declare(lib.clattn_block_mask_desc_init, None, POINTER(BlockMaskDesc))
_declare(lib.clattn_flex_block_mask, c_int, _ctx_p, POINTER(BlockMaskDesc), c_uint, c_void_p,
         c_void_p)
_declare(lib.clattn_plan_execute, c_int, _plan_p, POINTER(Tensors), c_size_t, c_void_p, c_void_p,
         c_uint, c_void_p, c_void_p)
_declare(lib.clattn_merge_states, c_int, _ctx_p, *([POINTER(Tensor)] * 6), c_uint, c_void_p,
         c_void_p)
_declare(lib.clattn_cascade_desc_init, None, POINTER(CascadeDesc))
_declare(lib.clattn_cascade_create, c_int, _ctx_p, POINTER(CascadeDesc), POINTER(c_void_p))
_declare(lib.clattn_cascade_execute, c_int, c_void_p, POINTER(CascadeDesc), c_uint, c_void_p,
         c_void_p)
_declare(lib.clattn_cascade_release, None, c_void_p)

class Validation(ctypes.Structure):
    """clattn_validation: one entry of a context's self-validation log."""
    _fields_ = [("variant", ctypes.c_char * 64), ("unit", ctypes.c_char * 32),
                ("detail", ctypes.c_char * 192), ("result", c_int),
                ("max_error", ctypes.c_double), ("tolerance", ctypes.c_double),
                ("milliseconds", ctypes.c_double)]


_declare(lib.clattn_ctx_validations, c_size_t, _ctx_p, POINTER(Validation), c_size_t)
_declare(lib.clattn_doctor, c_int, _ctx_p, c_char_p, POINTER(c_size_t), POINTER(c_size_t))

# OpenCL 1.2 (the ICD loader's)
CL_MEM_READ_WRITE = 1 << 0
CL_MEM_READ_ONLY = 1 << 2
CL_MEM_COPY_HOST_PTR = 1 << 5
CL_DEVICE_NAME = 0x102B
_declare(cl.clCreateBuffer, c_void_p, c_void_p, c_uint64, c_size_t, c_void_p, POINTER(c_int32))
_declare(cl.clReleaseMemObject, c_int32, c_void_p)
_declare(cl.clEnqueueReadBuffer, c_int32, c_void_p, c_void_p, c_uint, c_size_t, c_size_t,
         c_void_p, c_uint, c_void_p, c_void_p)
_declare(cl.clEnqueueWriteBuffer, c_int32, c_void_p, c_void_p, c_uint, c_size_t, c_size_t,
         c_void_p, c_uint, c_void_p, c_void_p)
_declare(cl.clReleaseEvent, c_int32, c_void_p)
_declare(cl.clGetDeviceInfo, c_int32, c_void_p, c_uint, c_size_t, c_void_p, POINTER(c_size_t))
