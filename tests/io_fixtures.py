#!/usr/bin/env python3
"""Writes the small files of tests/io/ that check_io reads: .npy files written by numpy itself
(format versions 1.0, 2.0 and 3.0, every dtype clattn reads, and the ones it must refuse) and a
.safetensors file laid out the way the safetensors library lays one out (header padded with
spaces to a multiple of 8, tensors in the data section in header order).

Needs only numpy. The values are simple formulas that tests/check_io.c recomputes; rerun this
script and commit the output only when those formulas change:

    python3 tests/io_fixtures.py tests/io
"""
import json
import os
import struct
import sys

import numpy as np
from numpy.lib import format as npy_format


def save_npy(directory, name, array, version=None):
    with open(os.path.join(directory, name), "wb") as handle:
        npy_format.write_array(handle, array, version=version, allow_pickle=False)


def bf16_bytes(values):
    """float32 -> bfloat16 by keeping the upper 16 bits (values chosen to be exact)."""
    bits = np.asarray(values, dtype="<f4").view("<u4")
    return (bits >> 16).astype("<u2").tobytes()


def save_safetensors(directory, name, tensors, metadata):
    """tensors: list of (name, dtype string, shape, raw little-endian bytes)."""
    header = {"__metadata__": metadata}
    offset = 0
    for tensor_name, dtype, shape, raw in tensors:
        header[tensor_name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(os.path.join(directory, name), "wb") as handle:
        handle.write(struct.pack("<Q", len(text)))
        handle.write(text)
        for _, _, _, raw in tensors:
            handle.write(raw)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "io")
    os.makedirs(directory, exist_ok=True)

    # value(i) = 0.5 * i - 1 over a C-order (3, 4) array
    f4 = (np.arange(12, dtype="<f4") * 0.5 - 1).reshape(3, 4)
    save_npy(directory, "np_f4_v1.npy", f4)
    save_npy(directory, "np_f4_v3.npy", f4, version=(3, 0))
    f8 = np.array([[0.1, -2.0, 1e300], [-1e300, np.inf, np.nan]], dtype="<f8")
    save_npy(directory, "np_f8_v2.npy", f8, version=(2, 0))
    save_npy(directory, "np_bool.npy", np.array([[True, False, True], [False, False, True]]))
    save_npy(directory, "np_u1.npy", np.array([0, 7, 255], dtype=np.uint8))
    save_npy(directory, "np_scalar.npy", np.array(2.5, dtype="<f4"))
    save_npy(directory, "np_empty.npy", np.zeros((0, 3), dtype="<f4"))
    save_npy(directory, "np_fortran.npy", np.asfortranarray(f4))
    save_npy(directory, "np_big_endian.npy", np.arange(3, dtype=">f4"))
    save_npy(directory, "np_i8.npy", np.arange(3, dtype="<i8"))

    # value(i) = i - 2.5 over a C-order (2, 3) array, then F16/BF16 copies of exact values
    weight = np.arange(6, dtype="<f4").reshape(2, 3) - 2.5
    half = np.array([0.0, 1.0, -2.0, 65504.0, 2.0**-24, np.inf], dtype="<f2")
    brain = np.array([1.0, -2.5, 3.140625, -np.inf], dtype="<f4")
    save_safetensors(
        directory,
        "st_mixed.safetensors",
        [
            ("weight", "F32", weight.shape, weight.tobytes()),
            ("half", "F16", half.shape, half.tobytes()),
            ("brain", "BF16", brain.shape, bf16_bytes(brain)),
            ("ids", "I64", (2,), np.array([7, -1], dtype="<i8").tobytes()),
        ],
        {"format": "pt"},
    )


if __name__ == "__main__":
    main()
