"""PyTorch's FlexAttention on clattn: ``flex_attention`` and ``create_block_mask`` with
torch.nn.attention.flex_attention's signatures, the score_mod / mask_mod functions translated
into OpenCL C (clattn.flex_translate) and built into clattn's own kernels (clattn_flex_desc).

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    block_mask = clattn.create_block_mask(causal, None, None, L, L)
    out = clattn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + (i - j),
                                block_mask=block_mask)

numpy in gives numpy out; torch tensors in give torch tensors out, differentiable in query,
key and value. torch is never imported here (a torch object can only come in once torch is
imported)."""

from __future__ import annotations

import ctypes
import re
import sys
import threading
from typing import NamedTuple, Optional

import numpy as np

from . import _common, _lib, _sdpa_grad, _torch, flex_translate
from ._core import ArgumentError, ArrayLike, Buffer, Context, default_context, layout
from ._lib import cl, lib
from .flex_translate import TranslateError, translate

__all__ = ["BlockMask", "TilesVisited", "create_block_mask", "flex_attention",
           "last_tiles_visited", "TranslateError"]

_CODES = {"float": _lib.F32, "int": _lib.I32, "uchar": _lib.U8}
# torch's FlexKernelOptions (Triton tuning knobs): accepted, and ignored by clattn
_TORCH_KERNEL_OPTIONS = frozenset((
    "BACKEND", "BLOCKS_ARE_CONTIGUOUS", "BLOCK_M", "BLOCK_M1", "BLOCK_M2", "BLOCK_N",
    "BLOCK_N1", "BLOCK_N2", "FORCE_USE_FLEX_ATTENTION", "PRESCALE_QK", "ROWS_GUARANTEED_SAFE",
    "USE_TMA", "WRITE_DQ", "kpack", "matrix_instr_nonkdim", "num_stages", "num_warps",
    "waves_per_eu", "OUTPUT_LOGSUMEXP", "OUTPUT_MAX"))
_GRAD_DEFINED = re.compile(r"\bscore_mod_grad\s*\(")


class TilesVisited(NamedTuple):
    """The fused kernel's tiles in one counted forward (kernel_options={"count_tiles": True}):
    ``tiles`` visited, each ``tile_rows`` query rows of one (batch, head) against
    ``tile_keys`` keys."""
    tiles: int
    tile_rows: int
    tile_keys: int


_counted = threading.local()


def last_tiles_visited() -> Optional[TilesVisited]:
    """The tiles the last :func:`flex_attention` call of this thread with
    ``kernel_options={"count_tiles": True}`` visited (its forward), or None before any."""
    return getattr(_counted, "last", None)


class _Flex:
    """The user functions of one call as the C plans take them (clattn_flex_desc): OpenCL C
    source, its clattn_flex_flags, the auxiliary tensors (name, flat array, clattn dtype), and
    the block mask (uint8 (B|1, H|1, q blocks, k blocks)) with its block sizes. What
    _sdpa_grad.sdpa_forward / sdpa_backward bind through their _flex argument: key (part of
    the plan's cache key), inputs() (role -> (clattn dtype, array)), fill(desc) and
    executed(ctx, plan) (reads the tile count)."""

    def __init__(self, source: str, functions: int, aux, blocks=None, block_size=(0, 0),
                 count_tiles: bool = False):
        if len(aux) > _lib.FLEX_AUX_MAX:
            raise ArgumentError(_lib.ERR_UNSUPPORTED,
                                f"the score and mask functions read {len(aux)} captured tensors "
                                f"({', '.join(a[0] for a in aux)}); clattn takes at most "
                                f"{_lib.FLEX_AUX_MAX}: combine some into one tensor")
        self.source = source
        self.functions = functions
        self.aux = aux
        self.blocks = blocks
        self.block_size = tuple(int(b) for b in block_size)
        self.count_tiles = bool(count_tiles)
        self.key = (source, functions, tuple((n, c, a.shape) for n, a, c in aux),
                    None if blocks is None else blocks.shape, self.block_size, self.count_tiles)
        self.tiles: Optional[TilesVisited] = None

    def inputs(self) -> dict:
        d = {f"flex_aux{i}": (code, a) for i, (_, a, code) in enumerate(self.aux)}
        if self.blocks is not None:
            d["block_mask"] = (_lib.U8, self.blocks)
        return d

    def fill(self, desc) -> None:
        self._keep = [self.source.encode()] + [n.encode() for n, _, _ in self.aux]
        desc.flex.source = self._keep[0]
        desc.flex.functions = self.functions
        for i, name in enumerate(self._keep[1:]):
            desc.flex.aux_names[i] = name
        if self.blocks is not None:
            desc.flex.block_q, desc.flex.block_k = self.block_size
        desc.flex.count_tiles = int(self.count_tiles)

    def executed(self, ctx: Context, plan) -> None:
        if not self.count_tiles:
            return
        tiles, rows, keys = ctypes.c_ulonglong(), ctypes.c_size_t(), ctypes.c_size_t()
        ctx.check(lib.clattn_plan_tiles_visited(plan, None, ctypes.byref(tiles),
                                                ctypes.byref(rows), ctypes.byref(keys)))
        self.tiles = TilesVisited(tiles.value, rows.value, keys.value)


def _aux_entries(translated, given, entry: str) -> list:
    """[(name, flat C-contiguous array, clattn dtype)]: the translator's captured tensors, then
    the `aux` dict's (for OpenCL C source functions). A tensor that requires grad while torch
    records gradients is refused: captured tensors are constants."""
    torch = sys.modules.get("torch")
    recording = torch is not None and torch.is_grad_enabled()
    entries, seen = [], {}
    for a in translated:
        if recording and a.requires_grad:
            raise ArgumentError(_lib.ERR_UNSUPPORTED,
                                f"{entry}: the captured tensor '{a.name}' requires grad, but "
                                f"clattn takes captured tensors as constants (no gradient): "
                                f"capture {a.name}.detach(), or call under torch.no_grad()")
        seen[a.name] = a.array
        entries.append((a.name, np.ascontiguousarray(a.array).reshape(-1), _CODES[a.ctype]))
    for name, obj in (given or {}).items():
        if not isinstance(name, str):
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{entry}: aux's keys are the C names the source reads; got "
                                f"{name!r}")
        if recording and getattr(obj, "requires_grad", False):
            raise ArgumentError(_lib.ERR_UNSUPPORTED,
                                f"{entry}: aux['{name}'] requires grad, but clattn takes "
                                f"auxiliary tensors as constants (no gradient): pass "
                                f"aux['{name}'].detach()")
        try:
            arr, ctype, _ = flex_translate._tensor_array(obj)
        except TranslateError as e:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"{entry}: aux['{name}']: {e}") \
                from None
        if name in seen:
            if np.array_equal(seen[name], arr):
                continue
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{entry}: aux['{name}'] and a captured tensor of the "
                                f"functions share the name '{name}': rename one")
        seen[name] = arr
        entries.append((name, np.ascontiguousarray(arr).reshape(-1), _CODES[ctype]))
    return entries


def _translate(score_mod, mask_mod, aux, entry: str):
    """(source, clattn_flex_flags, aux entries) of the user functions."""
    for role, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is not None and not isinstance(fn, str) and not callable(fn):
            raise TranslateError(f"{entry}: {role} must be a Python function or OpenCL C "
                                 f"source, not {type(fn).__name__}")
    source, translated = translate(score_mod, mask_mod, want_grad=True)
    functions = 0
    if score_mod is not None:
        functions |= _lib.FLEX_SCORE_MOD
        if not isinstance(score_mod, str) or _GRAD_DEFINED.search(score_mod):
            functions |= _lib.FLEX_SCORE_MOD_GRAD
    if mask_mod is not None:
        functions |= _lib.FLEX_MASK_MOD
    return source, functions, _aux_entries(translated, aux, entry)


def _block_size(BLOCK_SIZE) -> tuple:
    if isinstance(BLOCK_SIZE, (int, np.integer)) and not isinstance(BLOCK_SIZE, bool):
        sizes = (int(BLOCK_SIZE), int(BLOCK_SIZE))
    else:
        try:
            sizes = tuple(int(b) for b in BLOCK_SIZE)
        except (TypeError, ValueError):
            sizes = ()
    if len(sizes) != 2 or min(sizes) < 1:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"BLOCK_SIZE={BLOCK_SIZE!r}: expected an int >= 1 or a tuple "
                            f"(Q_BLOCK_SIZE, KV_BLOCK_SIZE)")
    return sizes


class BlockMask:
    """A block mask made by :func:`create_block_mask`: the mask_mod (a Python function or
    OpenCL C source, with ``aux``, its auxiliary tensors by name), ``BLOCK_SIZE`` (Q, KV),
    ``seq_lengths`` (Q_LEN, KV_LEN), ``shape`` (B|1, H|1, Q_LEN, KV_LEN) as torch's, and the
    blocks, computed on the device: uint8 (B|1, H|1, ceil(Q_LEN / Q_BLOCK),
    ceil(KV_LEN / KV_BLOCK)), 0 where mask_mod keeps no (q, kv) of the block, 2 where it keeps
    every one, else 1 (``to_dense()``; torch's to_dense gives 0/1 where clattn's gives 0/1/2).
    :func:`flex_attention` skips the empty blocks' tiles and calls mask_mod only on partial
    ones."""

    def __init__(self, mask_mod, aux, blocks: np.ndarray, block_size: tuple,
                 seq_lengths: tuple):
        self.mask_mod = mask_mod
        self.aux = dict(aux or {})
        self.blocks = blocks
        self.BLOCK_SIZE = tuple(block_size)
        self.seq_lengths = tuple(seq_lengths)
        self.shape = blocks.shape[:2] + self.seq_lengths

    def to_dense(self) -> np.ndarray:
        """The per-block array (a copy): uint8 (B|1, H|1, q blocks, kv blocks), 0 empty,
        1 partial, 2 full."""
        return self.blocks.copy()

    def sparsity(self) -> float:
        """The percentage of blocks that are empty (never computed), as torch's."""
        return 100.0 * float(np.mean(self.blocks == 0)) if self.blocks.size else 0.0

    def __repr__(self) -> str:
        full = 100.0 * float(np.mean(self.blocks == 2)) if self.blocks.size else 0.0
        return (f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, "
                f"sparsity={self.sparsity():.2f}%, full={full:.2f}%)")


def _device_blocks(ctx: Context, source: str, aux: list, sizes: tuple, block_size: tuple):
    """clattn_flex_block_mask: the uint8 blocks of (batch, heads, seq_q, seq_k) on ctx."""
    batch, heads, seq_q, seq_k = sizes
    bq, bk = block_size
    out = np.empty((batch, heads, -(-seq_q // bq), -(-seq_k // bk)), np.uint8)
    desc = _lib.BlockMaskDesc()
    lib.clattn_block_mask_desc_init(ctypes.byref(desc))
    keep = [source.encode()] + [n.encode() for n, _, _ in aux]
    desc.flex.source = keep[0]
    desc.flex.functions = _lib.FLEX_MASK_MOD
    desc.flex.block_q, desc.flex.block_k = bq, bk
    desc.batch, desc.heads, desc.seq_q, desc.seq_k = batch, heads, seq_q, seq_k
    tensors = (_lib.Tensor * _lib.FLEX_AUX_MAX)()
    with ctx.lock:
        buffers = []
        for i, (name, a, code) in enumerate(aux):
            desc.flex.aux_names[i] = keep[1 + i]
            buffers.append(Buffer(ctx, a))
            tensors[i] = layout(code, a.shape)
            tensors[i].mem = buffers[-1].mem
        desc.aux = ctypes.cast(tensors, ctypes.POINTER(_lib.Tensor))
        out_buf = Buffer(ctx, nbytes=out.nbytes)
        desc.out = layout(_lib.U8, out.shape)
        desc.out.mem = out_buf.mem
        event = ctypes.c_void_p()
        ctx.check(lib.clattn_flex_block_mask(ctx.handle, ctypes.byref(desc), 0, None,
                                             ctypes.byref(event)))
        try:
            status = cl.clEnqueueReadBuffer(lib.clattn_ctx_queue(ctx.handle), out_buf.mem, 1,
                                            0, out.nbytes, out.ctypes.data, 1,
                                            ctypes.byref(event), None)
        finally:
            cl.clReleaseEvent(event)
        if status != 0:
            from ._core import _raise
            _raise(status, f"clEnqueueReadBuffer failed with {status}")
    return out


def _length(name: str, value, allow_none: bool) -> int:
    if value is None and allow_none:
        return 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{name}={value!r}: expected an int >= 1"
                            f"{' or None (broadcast)' if allow_none else ''}")
    return int(value)


def create_block_mask(mask_mod, B: Optional[int], H: Optional[int], Q_LEN: int, KV_LEN: int,
                      device=None, BLOCK_SIZE=128, *, aux: Optional[dict] = None,
                      ctx: Optional[Context] = None) -> BlockMask:
    """torch.nn.attention.flex_attention.create_block_mask on the clattn device: the blocks of
    mask_mod(b, h, q_idx, kv_idx) (True: the key takes part) over B x H x Q_LEN x KV_LEN, each
    BLOCK_SIZE (an int, or a tuple (Q_BLOCK_SIZE, KV_BLOCK_SIZE)) evaluated on the device
    (clattn_flex_block_mask). B or H None: the mask does not depend on it (size 1, broadcast).

    mask_mod: a Python function as FlexAttention takes it (translated into OpenCL C by
    clattn.flex_translate; unsupported constructs raise clattn.flex_translate.TranslateError),
    or OpenCL C source defining ``int mask_mod(int b, int h, int q_idx, int kv_idx)`` whose
    auxiliary tensors come in ``aux`` (keyword only: a dict C name -> numpy array or tensor
    of float, int or bool values, read as ``__global const float/int/uchar *NAME`` at flat
    indices). device: accepted for torch's signature and ignored (the blocks are computed on
    ``ctx``'s device, None: the default context, and kept as a numpy array).
    Returns a :class:`BlockMask`."""
    b, h = _length("B", B, True), _length("H", H, True)
    q_len, kv_len = _length("Q_LEN", Q_LEN, False), _length("KV_LEN", KV_LEN, False)
    sizes = _block_size(BLOCK_SIZE)
    if mask_mod is None:
        raise TranslateError("create_block_mask: mask_mod is None (use noop_mask, or no block "
                             "mask at all)")
    source, _, entries = _translate(None, mask_mod, aux, "create_block_mask")
    blocks = _device_blocks(ctx or default_context(), source, entries, (b, h, q_len, kv_len),
                            sizes)
    return BlockMask(mask_mod, aux, blocks, sizes, (q_len, kv_len))


def _as_block_mask(block_mask, ctx) -> Optional[BlockMask]:
    """A clattn BlockMask; torch's (anything with mask_mod, BLOCK_SIZE, seq_lengths and
    kv_num_blocks) rebuilt with clattn from its mask_mod and sizes."""
    if block_mask is None or isinstance(block_mask, BlockMask):
        return block_mask
    if all(hasattr(block_mask, a) for a in ("mask_mod", "BLOCK_SIZE", "seq_lengths",
                                            "kv_num_blocks")):
        b, h = (int(n) for n in block_mask.kv_num_blocks.shape[:2])
        q_len, kv_len = (int(n) for n in block_mask.seq_lengths)
        return create_block_mask(block_mask.mask_mod, b, h, q_len, kv_len,
                                 BLOCK_SIZE=tuple(block_mask.BLOCK_SIZE), ctx=ctx)
    raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                        f"block_mask: expected a clattn.BlockMask (clattn.create_block_mask) or "
                        f"torch's BlockMask, not {type(block_mask).__name__}")


def _kernel_options(kernel_options) -> bool:
    """count_tiles from kernel_options (torch's own keys are accepted and ignored)."""
    if kernel_options is None:
        return False
    if not isinstance(kernel_options, dict):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"kernel_options: expected a dict, not "
                            f"{type(kernel_options).__name__}")
    unknown = sorted(set(kernel_options) - _TORCH_KERNEL_OPTIONS - {"count_tiles"})
    if unknown:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"kernel_options: unknown key(s) {unknown}: clattn takes "
                            f"'count_tiles' (and ignores torch's Triton options)")
    return bool(kernel_options.get("count_tiles", False))


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def _check_shapes(query, key, value, enable_gqa) -> tuple:
    qs, ks, vs = _shape(query), _shape(key), _shape(value)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"flex_attention: query {qs}, key {ks}, value {vs}: expected 4-D "
                            f"(B, Hq, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev)")
    if qs[0] != ks[0] or vs[0] != ks[0] or qs[3] != ks[3] or vs[1] != ks[1] or \
            vs[2] != ks[2] or 0 in qs or 0 in ks or 0 in vs:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"flex_attention: query {qs}, key {ks}, value {vs}: expected "
                            f"(B, Hq, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev), no dimension 0")
    hq, hkv = qs[1], ks[1]
    if hq != hkv and not (enable_gqa and hq % hkv == 0):
        if enable_gqa:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"flex_attention: number of heads in key/value must divide "
                                f"number of heads in query: Hq={hq}, Hkv={hkv}")
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"flex_attention: expect query and key/value to have the same "
                            f"number of heads but got Hq={hq} and Hkv={hkv}. Try setting "
                            f"enable_gqa=True for GQA.")
    return qs[0], hq, qs[2], ks[2]


def flex_attention(query: ArrayLike, key: ArrayLike, value: ArrayLike, score_mod=None,
                   block_mask=None, scale: Optional[float] = None, enable_gqa: bool = False,
                   return_lse: bool = False, kernel_options: Optional[dict] = None, *,
                   aux: Optional[dict] = None, ctx: Optional[Context] = None):
    """torch.nn.attention.flex_attention.flex_attention on the clattn device: softmax over
    score_mod(scale * q·k, b, h, q_idx, kv_idx) of the keys block_mask's mask_mod keeps,
    times v, in clattn's fused kernels (forward and backward).

    query (B, Hq, L, E), key (B, Hkv, S, E), value (B, Hkv, S, Ev): float32, float16, bfloat16
    (ml_dtypes) or float64 (computed in float32, returned as float64); Hkv == Hq, or with
    enable_gqa a divisor of Hq (query head h uses key head h // (Hq // Hkv)), else
    ArgumentError (a ValueError) as torch raises. scale: None for 1/sqrt(E).
    score_mod(score, b, h, q_idx, kv_idx) -> score and block_mask.mask_mod(b, h, q_idx, kv_idx)
    -> bool: Python functions as FlexAttention takes them, translated into OpenCL C
    (clattn.flex_translate: unsupported constructs raise its TranslateError, a TypeError);
    h is the query head. Captured tensors (torch or numpy, at most 4 in all) are constants:
    while torch records gradients, one that requires grad is refused (ArgumentError naming
    it). Either function may instead be OpenCL C source (see clattn_flex_desc in clattn.h; a
    score_mod source must define score_mod_grad too for the backward); its auxiliary tensors
    come in ``aux`` (keyword only): a dict C name -> array or tensor, read by the source as
    ``__global const float/int/uchar *NAME`` at flat indices (a name the block mask's own
    aux has is overridden here: its blocks must still agree with the mask). A source that does not build
    raises clattn.DeviceError with the compiler's log, its lines numbered
    ``score_mod:LINE``.
    block_mask: a :class:`BlockMask` from :func:`create_block_mask` of (B|1, Hq|1, L, S), or
    torch's BlockMask (rebuilt by clattn from its mask_mod, sizes and BLOCK_SIZE). Its empty
    blocks' tiles are skipped; its mask_mod masks the keys of its partial blocks.
    return_lse: also return the rows' log-sum-exp (natural log, as torch's), (B, Hq, L),
    float32 (float64 for float64 queries); -inf for a row with no key (whose output is 0,
    as torch's). kernel_options: a dict; ``{"count_tiles": True}`` counts the tiles the fused
    forward visits (read with :func:`last_tiles_visited`); torch's Triton options are
    accepted and ignored; other keys raise ArgumentError.
    numpy in gives numpy out; torch tensors in give torch tensors out (query's dtype and
    device). Where torch records gradients and query, key or value requires grad, the call is
    a torch.autograd.Function: backward() runs clattn's backward with the translated
    d score_mod / d score (lse carries no gradient). ctx (keyword only): the clattn.Context
    (None: the default one)."""
    count_tiles = _kernel_options(kernel_options)
    B, Hq, L, S = _check_shapes(query, key, value, enable_gqa)
    if scale is not None and isinstance(scale, (bool, np.bool_)):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"scale={scale!r}: expected a float")
    bm = _as_block_mask(block_mask, ctx)
    if bm is not None:
        bb, bh = bm.blocks.shape[:2]
        if bm.seq_lengths != (L, S) or bb not in (1, B) or bh not in (1, Hq):
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"flex_attention: block_mask has shape {bm.shape}, but query "
                                f"and key need ({B} or 1, {Hq} or 1, {L}, {S})")
    source, functions, entries = _translate(score_mod, None if bm is None else bm.mask_mod,
                                            {**(bm.aux if bm is not None else {}),
                                             **(aux or {})}, "flex_attention")
    if functions == 0:  # no user functions: plain attention
        spec = None
    else:
        spec = _Flex(source, functions, entries, None if bm is None else bm.blocks,
                     (0, 0) if bm is None else bm.BLOCK_SIZE, count_tiles)
    like = _torch.any_tensor(query, key, value)
    if like is not None and _common._needs_grad(query, key, value):
        from ._flex_autograd import flex_autograd
        out, lse = flex_autograd(query, key, value, spec, scale, enable_gqa, ctx)
    else:
        forward = _torch.torch_io("flex_attention")(_sdpa_grad._sdpa_forward)
        out, lse = forward(query, key, value, None, False, scale, bool(enable_gqa), ctx=ctx,
                           _flex=spec)
    if count_tiles:
        _counted.last = None if spec is None else spec.tiles
    if not return_lse:
        return out
    if like is not None:
        import torch
        if like.dtype == torch.float64:
            lse = lse.double()
    elif np.asarray(query).dtype == np.float64:
        lse = lse.astype(np.float64)
    return out, lse


def tree_mask(trees, prefix_lens) -> tuple:
    """Speculative decoding's tree mask (clattn_flex_tree_mask) as a FlexAttention mask_mod:
    returns (mask_mod, aux), the OpenCL C source and its tensors, for
    ``create_block_mask(mask_mod, ..., aux=aux)`` and ``flex_attention(..., aux=aux)`` (or the
    C library's plans over a paged cache and packed batches).

    trees: per sequence b, an (n_b, n_b) boolean matrix whose (i, j) is True when draft j is
    draft i or one of its ancestors (None or an empty matrix: no tree, every key kept).
    prefix_lens: per sequence, the keys before its drafts (its committed length). Query row i
    of sequence b is draft i: it keeps the prefix and the draft keys prefix_lens[b] + j that
    row i of its matrix sets; rows past n_b keep the prefix only. The bits travel packed as
    FlashInfer's custom_mask (row-major, np.packbits(bitorder="little")), one sequence after
    another from a byte boundary; ``aux["tree_meta"]`` is int32 (B, 3): prefix, n_b, byte
    offset."""
    desc = _lib.FlexDesc()
    lib.clattn_flex_tree_mask(ctypes.byref(desc))
    chunks, meta, offset = [], [], 0
    if len(trees) != len(prefix_lens):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"{len(trees)} trees but {len(prefix_lens)} prefix_lens")
    for b, tree in enumerate(trees):
        m = np.zeros((0, 0), bool) if tree is None else np.asarray(tree, bool)
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                                f"trees[{b}] has shape {m.shape}: expected (n, n)")
        packed = np.packbits(m.reshape(-1), bitorder="little")
        meta.append((int(prefix_lens[b]), m.shape[0], offset))
        chunks.append(packed)
        offset += packed.size
    bits = np.concatenate(chunks + [np.zeros(1, np.uint8)])  # (never empty)
    aux = {"tree_bits": bits.astype(np.uint8), "tree_meta": np.array(meta, np.int32)}
    return desc.source.decode(), aux
