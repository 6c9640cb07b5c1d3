#!/usr/bin/env python3
"""The Python binding's ctypes layouts (python/clattn/_lib.py) against the C structs: runs
tests/abi_layout (built with the library; it prints each struct's sizeof and field offsets)
and compares every size and offset with the ctypes class of the same name. ctest abi_layout.

    tests/python/check_layout.py ABI_LAYOUT_BINARY
(CLATTN_LIBRARY must name libclattn: _lib.py loads it on import.)"""
import importlib.util
import os
import subprocess
import sys


def main():
    binary = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.join(here, "..", "..", "python", "clattn", "_lib.py")
    spec = importlib.util.spec_from_file_location("clattn_lib_layout", source)
    lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lib)  # _lib alone: no numpy needed
    printed = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
    problems, checked = [], 0
    for line in printed.splitlines():
        name, size, *fields = line.split()
        cls = getattr(lib, name, None)
        if cls is None:
            problems.append(f"{name}: no ctypes class of that name in _lib.py")
            continue
        if ctypes_size(cls) != int(size):
            problems.append(f"{name}: sizeof is {size} in C, {ctypes_size(cls)} in ctypes")
        for item in fields:
            field, offset = item.split("=")
            checked += 1
            if not hasattr(cls, field):
                problems.append(f"{name}.{field}: missing in ctypes")
            elif getattr(cls, field).offset != int(offset):
                problems.append(f"{name}.{field}: offset {offset} in C, "
                                f"{getattr(cls, field).offset} in ctypes")
    print(f"abi_layout: {len(printed.splitlines())} structs, {checked} fields compared")
    for p in problems:
        print("  " + p)
    return 1 if problems or checked == 0 else 0


def ctypes_size(cls):
    import ctypes
    return ctypes.sizeof(cls)


if __name__ == "__main__":
    sys.exit(main())
