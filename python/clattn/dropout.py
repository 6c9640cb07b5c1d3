"""Attention dropout's mask, as every clattn device draws it (clattn_sdpa_desc.dropout_p,
dropout_seed, dropout_offset): Philox 4x32-10 on the host in numpy, and the checks and seed
draws the Python entry points share."""

from __future__ import annotations

import math
import operator
from typing import Optional, Sequence

import numpy as np

from . import _lib
from ._core import ArgumentError

_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
# Philox 4x32's multipliers and Weyl key increments (Random123)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


def _probability(dropout_p, what: str = "dropout_p") -> float:
    """dropout_p as a float in [0, 1] (ArgumentError otherwise; bools are refused)."""
    if not isinstance(dropout_p, (int, float, np.integer, np.floating)) or \
            isinstance(dropout_p, (bool, np.bool_)) or not 0.0 <= float(dropout_p) <= 1.0:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{what}={dropout_p!r}: expected a probability in [0, 1]")
    return float(dropout_p)


def _u64(value, what: str) -> int:
    """An integer in [0, 2^64) (a seed or an offset); ArgumentError otherwise."""
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT, f"{what}={value!r}: expected an integer")
    try:
        n = operator.index(value)
    except TypeError:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{what}={value!r}: expected an integer") from None
    if not 0 <= n <= _U64:
        raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                            f"{what}={value!r}: expected an integer in [0, 2**64)")
    return n


def _threshold(p: float) -> int:
    """clattn__dropout_fields: a weight is kept when its word u >= floor(p * 2^32) (at most
    2^32 - 1)."""
    return min(math.floor(p * 4294967296.0), _U32)


def philox4x32_10(counter: Sequence, key: Sequence) -> tuple:
    """Philox 4x32-10 (Random123) of the counter words (c0, c1, c2, c3) under the key words
    (k0, k1): four uint32 arrays (the counters broadcast together). For checking; see
    :func:`dropout_mask`."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & np.uint64(_U32) for c in counter)
    k0, k1 = (int(k) & _U32 for k in key)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    mask, shift = np.uint64(_U32), np.uint64(32)
    for _ in range(10):
        p0, p1 = c0 * _M0, c2 * _M1  # 32 x 32 bits: exact in uint64
        c0, c1, c2, c3 = ((p1 >> shift) ^ c1 ^ np.uint64(k0), p1 & mask,
                          (p0 >> shift) ^ c3 ^ np.uint64(k1), p0 & mask)
        k0, k1 = (k0 + _W0) & _U32, (k1 + _W1) & _U32
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def dropout_mask(shape: Sequence[int], dropout_p: float, seed: int, offset: int = 0, *,
                 scaled: bool = False) -> np.ndarray:
    """Which attention weights clattn's dropout keeps (clattn_sdpa_desc.dropout_p,
    dropout_seed, dropout_offset; the forward and backward of every device draw exactly
    these), computed on the host in numpy.

    shape: the attention weights' shape, (batch, heads, seq_q, seq_k) with heads the query
    heads, or (..., seq_q, seq_k) in general: the leading dims are flattened into streams
    (rank 2 is one stream, rank 3 (heads, seq_q, seq_k) one batch), as
    scaled_dot_product_attention flattens its batch dims. dropout_p: in [0, 1]; seed and
    offset: integers in [0, 2^64), the same values given to the attention call
    (``dropout_seed``, ``dropout_offset``).

    Weight (b, h, i, j) belongs to stream offset + b * heads + h (mod 2^64); Philox 4x32-10
    with key (seed's low 32 bits, its high 32 bits) and counter (j // 4, i, the stream's low
    and high 32 bits) gives four words, and word j % 4, an unsigned 32-bit u, keeps the
    weight when u >= floor(dropout_p * 2^32) (at most 2^32 - 1); dropout_p = 0 keeps all.

    Returns a bool array of `shape`, True where the weight is kept (what
    ``clattn_dropout_keep`` answers point by point), or with ``scaled=True`` the float32
    factor the weights are multiplied by: 1 / (1 - dropout_p) where kept, else 0 (and 0
    everywhere for dropout_p = 1, whose scale is 0). Dropped attention is then
    ``(softmax(S) * factor) @ V``, S the masked, scaled scores (the normaliser and lse stay
    the undropped row's)."""
    p = _probability(dropout_p)
    seed, offset = _u64(seed, "seed"), _u64(offset, "offset")
    try:
        shape = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"shape={shape!r}: expected a sequence of integers") from None
    if len(shape) < 2 or any(n < 0 for n in shape):
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"shape={shape!r}: expected (..., seq_q, seq_k), sizes >= 0")
    rows, keys = shape[-2:]
    if rows > _U32 + 1 or keys > _U32 + 1:
        raise ArgumentError(_lib.ERR_INVALID_SHAPE,
                            f"shape={shape!r}: at most 2^32 query rows and keys")
    if p == 0.0:
        keep = np.ones(shape, dtype=bool)
        return keep.astype(np.float32) if scaled else keep
    streams = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
    quads = (keys + 3) // 4
    threshold = np.uint32(_threshold(p))
    keep = np.empty((streams, rows, keys), dtype=bool)
    rows_c = np.arange(rows, dtype=np.uint64).reshape(1, rows, 1)
    quads_c = np.arange(quads, dtype=np.uint64).reshape(1, 1, quads)
    # a few million words at a time: the Philox state is four uint64 arrays
    step = max(1, (1 << 22) // max(1, rows * quads))
    for first in range(0, streams, step):
        n = min(step, streams - first)
        stream = (np.arange(first, first + n, dtype=np.uint64) +  # wraps mod 2^64
                  np.uint64(offset)).reshape(n, 1, 1)
        words = philox4x32_10((quads_c, rows_c, stream & np.uint64(_U32),
                               stream >> np.uint64(32)), (seed & _U32, seed >> 32))
        u = np.stack(words, axis=-1).reshape(n, rows, 4 * quads)[..., :keys]
        keep[first:first + n] = u >= threshold
    keep = keep.reshape(shape)
    if not scaled:
        return keep
    scale = np.float32(1.0 / (1.0 - p)) if p < 1.0 else np.float32(0.0)
    return keep.astype(np.float32) * scale


def _dropout_args(dropout_p, dropout_seed, dropout_offset, *, torch_inputs: bool = False,
                  generator=None, entry: str = "scaled_dot_product_attention") -> Optional[tuple]:
    """(p, seed, offset) for a call with dropout, or None without (dropout_p = 0). A seed of
    None is drawn from `generator` (a torch.Generator) or, for torch inputs, from torch's
    default generator; numpy inputs need an explicit seed."""
    p = _probability(dropout_p)
    if p == 0.0:
        return None
    offset = _u64(dropout_offset, "dropout_offset")
    if dropout_seed is None:
        if generator is None and not torch_inputs:
            raise ArgumentError(_lib.ERR_INVALID_ARGUMENT,
                                f"{entry}: dropout_p={p} needs dropout_seed (an integer in "
                                f"[0, 2**64)) on numpy and pyopencl inputs; torch tensors draw "
                                f"it from torch's generator")
        dropout_seed = draw_seed(generator)
    return p, _u64(dropout_seed, "dropout_seed"), offset


def draw_seed(generator=None) -> int:
    """A dropout seed from torch's random numbers: `generator` (a torch.Generator) or torch's
    default CPU generator, so that ``torch.manual_seed`` makes the draws repeatable (one
    torch.randint per call)."""
    import torch
    kw = {} if generator is None else {"generator": generator, "device": generator.device}
    return int(torch.randint(0, 2 ** 63 - 1, (1,), **kw).item())
