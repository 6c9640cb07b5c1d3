"""An in-tree PEP 517 backend for the clattn Python package: builds libclattn with CMake and
packs it, with python/clattn, into a wheel. It needs nothing from PyPI (build-system.requires
is empty), so `pip install .` and `python -m build --wheel` work offline; CMake, a C compiler
and the OpenCL headers and ICD loader must be installed (Debian: cmake gcc pkg-config
ocl-icd-opencl-dev opencl-c-headers libcjson-dev libpng-dev). The OpenCL device stays the
system's. Environment: CLATTN_CMAKE_ARGS (extra -D options, e.g. -DCLATTN_SANITIZE=ON),
CLATTN_BUILD_DIR (the CMake build folder; default: a per-user cache folder,
$XDG_CACHE_HOME/clattn/build-<hash of the source path> (~/.cache by default), kept so that a
reinstall rebuilds incrementally, or a temporary folder removed afterwards where that cannot
be made: nothing is written into the source tree, so a read-only checkout installs)."""

from __future__ import annotations

import base64
import glob
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import zipfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NAME = "clattn"


def _version() -> str:
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(clattn VERSION ([0-9.]+)", f.read())
    if not match:
        raise RuntimeError("clattn_build: no project version in CMakeLists.txt")
    return match.group(1)


def _metadata() -> str:
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        "Summary: Transformer attention on OpenCL devices (a binding over libclattn)",
        "Requires-Python: >=3.9",
        "Requires-Dist: numpy",
        "Provides-Extra: pyopencl",
        "Requires-Dist: pyopencl; extra == \"pyopencl\"",
        "Provides-Extra: bfloat16",
        "Requires-Dist: ml_dtypes; extra == \"bfloat16\"",
        "",
    ])


def _tag() -> str:
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{platform}"


def _build_folder() -> tuple:
    """(folder, temporary): CLATTN_BUILD_DIR, else a per-user cache folder keyed by the
    source path, else a fresh temporary folder (temporary=True: the caller removes it)."""
    chosen = os.environ.get("CLATTN_BUILD_DIR")
    if chosen:
        return chosen, False
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(ROOT.encode()).hexdigest()[:16]
    folder = os.path.join(cache, "clattn", f"build-{key}")
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, ".writable")
        with open(probe, "w", encoding="utf-8") as f:
            f.write(ROOT + "\n")
        return folder, False
    except OSError:
        return tempfile.mkdtemp(prefix="clattn-build-"), True


def _build_library(build: str) -> str:
    extra = shlex.split(os.environ.get("CLATTN_CMAKE_ARGS", ""))
    subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                    "-DCLATTN_BUILD_TESTS=OFF", "-DCLATTN_BUILD_EXAMPLES=OFF"] + extra,
                   check=True)
    subprocess.run(["cmake", "--build", build, "--target", "clattn", "-j",
                    str(os.cpu_count() or 2)], check=True)
    candidates = [p for p in glob.glob(os.path.join(build, "libclattn.so*"))
                  if not os.path.islink(p)]
    if not candidates:
        raise RuntimeError(f"clattn_build: no libclattn.so in {build}")
    return max(candidates, key=len)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, library: str) -> str:
    version = _version()
    wheel_name = f"{NAME}-{version}-{_tag()}.whl"
    dist_info = f"{NAME}-{version}.dist-info"
    files = []
    package = os.path.join(ROOT, "python", NAME)
    for path in sorted(glob.glob(os.path.join(package, "*.py"))):
        with open(path, "rb") as f:
            files.append((f"{NAME}/{os.path.basename(path)}", f.read()))
    with open(library, "rb") as f:
        files.append((f"{NAME}/libclattn.so", f.read()))
    files.append((f"{dist_info}/METADATA", _metadata().encode()))
    files.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: clattn_build\nRoot-Is-Purelib: false\n"
        f"Tag: {_tag()}\n").encode()))
    record = [_record_line(path, data) for path, data in files]
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    target = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            wheel.writestr(info, data, zipfile.ZIP_DEFLATED)
    return wheel_name


# --- PEP 517 hooks ---------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build, temporary = _build_folder()
    try:
        return _write_wheel(wheel_directory, _build_library(build))
    finally:
        if temporary:
            shutil.rmtree(build, ignore_errors=True)


# Folders never part of a source tree that is not a git checkout (build outputs, venvs).
_NOT_SOURCE = re.compile(r"^(\.git|__pycache__|build|build-.*|venv.*|dist|.*\.egg-info)$")


def _source_files() -> list:
    """The source tree's files, relative to ROOT: git's tracked files where ROOT is the top of
    a git checkout; else (an unpacked sdist, a copy of the files without .git, which may lie
    inside another checkout's ignored build folder, where git would list nothing) every file
    under ROOT but build outputs, venvs and PKG-INFO (written anew)."""
    try:
        top = subprocess.run(["git", "-C", ROOT, "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        top = ""
    if top and os.path.realpath(top) == os.path.realpath(ROOT):
        listed = subprocess.run(["git", "-C", ROOT, "ls-files"], check=True,
                                capture_output=True, text=True).stdout.split("\n")
        files = [p for p in listed if p and os.path.lexists(os.path.join(ROOT, p))]
    else:
        files = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = sorted(d for d in dirs if not _NOT_SOURCE.match(d))
            rel = os.path.relpath(folder, ROOT)
            files += [n if rel == "." else os.path.join(rel, n) for n in sorted(names)
                      if not (rel == "." and n in ("PKG-INFO", ".git"))]
    for needed in ("pyproject.toml", "CMakeLists.txt", "python/build_backend/clattn_build.py"):
        if needed not in files:
            raise RuntimeError(f"clattn_build: the source tree at {ROOT} lacks {needed}")
    return files


def build_sdist(sdist_directory, config_settings=None):
    """The source tree (git's tracked files in a checkout, see _source_files) as
    NAME-VERSION.tar.gz."""
    version = _version()
    base = f"{NAME}-{version}"
    listed = _source_files()
    os.makedirs(sdist_directory, exist_ok=True)
    target = os.path.join(sdist_directory, f"{base}.tar.gz")
    with tarfile.open(target, "w:gz") as tar:
        for path in listed:
            tar.add(os.path.join(ROOT, path), arcname=f"{base}/{path}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return os.path.basename(target)


if __name__ == "__main__":  # python3 python/build_backend/clattn_build.py [--sdist] OUT_DIR
    import sys
    args = sys.argv[1:]
    hook = build_sdist if args[:1] == ["--sdist"] else build_wheel
    args = args[1:] if hook is build_sdist else args
    print(hook(args[0] if args else "dist"))
