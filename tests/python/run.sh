#!/bin/bash
# The Python package's lane: a virtual environment BUILD_DIR/venv-python (made on the first
# run: tests/python/requirements.txt from PyPI: numpy, pyopencl, pytest, hypothesis, ml_dtypes,
# onnx; never pip-install them system-wide, that shadows Debian's numpy), `pip install .` through the in-tree backend (python/build_backend:
# CMake builds libclattn into the wheel, offline), then pytest on tests/python from outside
# the source tree, so the installed wheel is what runs. Prints its time; exits with pytest's
# status.
#
#   tests/python/run.sh BUILD_DIR [pytest options...]
#
# The wheel is installed from a read-only copy of the tracked files (nothing may appear in it),
# and that copy's sdist must hold exactly the tracked files.
#
# CLATTN_PY_ASAN=1: the same tests on a wheel whose libclattn is built with ASan + UBSan
# (CLATTN_CMAKE_ARGS=-DCLATTN_SANITIZE=ON, build BUILD_DIR/python-asan, venv
# BUILD_DIR/venv-python-asan), the sanitizer runtimes preloaded into Python and only PoCL's ICD
# loaded (as the asan lane); leak checking off (the interpreter's own allocations).
#
# torch: its Linux wheels on PyPI carry CUDA (gigabytes), and PyTorch's CPU index is not
# reachable from CI, so the venv above has none and test_torch.py skips there. Where Debian's
# torch is installed (apt-get install --no-install-recommends python3-torch python3-pytest:
# about 140 MB, under a minute), a second step runs test_torch.py in BUILD_DIR/venv-python-torch,
# made with --system-site-packages so that Debian's torch and numpy are the ones imported;
# only the clattn wheel and ml_dtypes < 0.5 (the last built against numpy 1.x, for bfloat16)
# go into it, both --no-deps: nothing there shadows Debian's numpy. CLATTN_PY_TORCH=0 skips
# that step; without Debian's torch it is skipped with a note. CLATTN_PY_VENV=DIR uses an
# existing venv for the main step instead: the requirements are added to it if missing.
#
# Hugging Face transformers: a third step, tests/python/run_hf.sh, runs test_transformers.py
# (and test_compile*.py) in BUILD_DIR/venv-python-hf with PyPI's torch and a pinned
# transformers (the first run installs about 5.3 GB, CUDA's wheels included, which torch's
# PyPI wheel needs to import). CLATTN_PY_HF=0 skips it.
set -u -o pipefail
build=$(cd "${1:?usage: tests/python/run.sh BUILD_DIR [pytest options...]}" && pwd) || exit 2
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
asan=${CLATTN_PY_ASAN:-0}
venv=${CLATTN_PY_VENV:-$build/venv-python}
wheel_build=$build/python-wheel
cmake_args=${CLATTN_CMAKE_ARGS:-}
if [ "$asan" = 1 ]; then
    venv=$build/venv-python-asan
    wheel_build=$build/python-asan
    cmake_args="$cmake_args -DCLATTN_SANITIZE=ON"
fi
start=$(date +%s)
needs='import numpy, pytest, hypothesis, ml_dtypes, onnx, pyopencl'
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "$needs" 2>/dev/null; then
    { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
        "$venv/bin/pip" install -q -r "$here/requirements.txt" || {
        echo "python: cannot set up $venv (python3-venv, and PyPI for the test packages)" >&2
        exit 1
    }
fi
# Ring attention from Python (clattn.ring_attention, test_ring.py): mpi4py in the venv (a wheel
# from PyPI, run against the system's Open MPI) and the pocl lane's libclattn_mpi (built with
# -DCLATTN_MPI=ON into BUILD_DIR); without either, test_ring.py skips. Not under ASan (mpirun
# would start under the preloaded sanitizer).
if [ "$asan" != 1 ] && [ -e "$build/libclattn_mpi.so" ] && command -v mpirun >/dev/null; then
    "$venv/bin/python" -c 'import mpi4py' 2>/dev/null || "$venv/bin/pip" install -q mpi4py ||
        echo "python: no mpi4py from PyPI: the ring tests skip"
    export CLATTN_MPI_LIBRARY="$build/libclattn_mpi.so"
fi
if [ "$asan" = 1 ]; then
    CLATTN_BUILD_DIR=$wheel_build CLATTN_CMAKE_ARGS=$cmake_args "$venv/bin/pip" install -q \
        --force-reinstall --no-deps "$root" || { echo "python: pip install . failed" >&2; exit 1; }
else
    # `pip install .` from a read-only copy of the checkout (the tracked files, mtimes kept),
    # with the backend's default build folder (no CLATTN_BUILD_DIR; XDG_CACHE_HOME points it
    # into BUILD_DIR so that reruns rebuild incrementally): nothing may be written into the
    # source tree.
    src=$build/python-src-readonly
    { [ ! -e "$src" ] || { chmod -R u+w "$src" && rm -rf "$src"; }; } && mkdir -p "$src" &&
        (cd "$root" && git ls-files -z | xargs -0 cp -a --parents -t "$src") &&
        chmod -R a-w "$src" || { echo "python: cannot make a read-only copy of $root" >&2; exit 1; }
    env -u CLATTN_BUILD_DIR XDG_CACHE_HOME="$build/python-cache" CLATTN_CMAKE_ARGS=$cmake_args \
        "$venv/bin/pip" install -q --force-reinstall --no-deps "$src" ||
        { echo "python: pip install . from a read-only checkout failed" >&2; exit 1; }
    # root ignores the mode bits: check that no file appeared in the copy
    stray=$(cd "$src" && find . -type f | sed 's|^\./||' | sort |
        comm -23 - <(cd "$root" && git ls-files | sort) | head -3)
    if [ -n "$stray" ]; then
        echo "python: pip install wrote into the source tree: $stray" >&2; exit 1
    fi
    # the sdist of that copy (no .git, inside BUILD_DIR: git would list nothing there) holds
    # exactly the tracked files
    sdist=$(mktemp -d)
    (cd "$sdist" && "$venv/bin/python" "$src/python/build_backend/clattn_build.py" --sdist \
        "$sdist" >/dev/null) &&
        diff <(cd "$root" && git ls-files | sort) \
            <(tar tzf "$sdist"/clattn-*.tar.gz | sed 's|^[^/]*/||' | grep -vx PKG-INFO | sort) \
            >"$sdist/diff" ||
        { echo "python: the sdist of a read-only copy is not the tracked files:" \
            "$(head -3 "$sdist/diff" 2>/dev/null)" >&2; rm -rf "$sdist"; exit 1; }
    rm -rf "$sdist"
fi
cd "$build" || exit 1
if [ "$asan" = 1 ]; then
    vendors=$(mktemp -d)
    cp /etc/OpenCL/vendors/pocl.icd "$vendors/" 2>/dev/null || cp /etc/OpenCL/vendors/*.icd "$vendors/"
    LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
        ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        OCL_ICD_VENDORS=$vendors POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache} \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python" "$@"
    status=$?
    rm -rf "$vendors"
else
    POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache} "$venv/bin/python" -m pytest -q \
        -p no:cacheprovider "$root/tests/python" "$@"
    status=$?
    # the test files that use torch (autograd, torch in/out, parity) against Debian's torch
    # (see the header), the same wheel's sources; test_compile.py and test_transformers.py
    # need a newer torch (run_hf.sh's step)
    torch_tests=(test_torch.py test_backward.py test_dropout.py test_flash_attn.py
                 test_varlen_paged.py test_dropin.py test_parity.py test_flex.py)
    tvenv=$build/venv-python-torch
    if [ "${CLATTN_PY_TORCH:-1}" = 0 ]; then
        echo "python: torch step skipped (CLATTN_PY_TORCH=0)"
    elif ! /usr/bin/python3 -c 'import torch, pytest' 2>/dev/null; then
        echo "python: torch step skipped: no Debian torch (apt-get install" \
            "--no-install-recommends python3-torch python3-pytest)"
    else
        tstart=$(date +%s)
        if [ ! -x "$tvenv/bin/python" ]; then
            /usr/bin/python3 -m venv --system-site-packages "$tvenv" &&
                "$tvenv/bin/pip" install -q --no-deps "ml_dtypes<0.5" ||
                { echo "python: cannot set up $tvenv" >&2; status=1; }
        fi
        if [ -x "$tvenv/bin/python" ] &&
            env -u CLATTN_BUILD_DIR XDG_CACHE_HOME="$build/python-cache" \
                CLATTN_CMAKE_ARGS=$cmake_args "$tvenv/bin/pip" install -q --force-reinstall \
                --no-deps "$src"; then
            numpy_at=$("$tvenv/bin/python" -c 'import numpy; print(numpy.__file__)')
            case $numpy_at in
                /usr/lib/python3/dist-packages/*) ;;
                *) echo "python: $tvenv imports numpy from $numpy_at, not Debian's" >&2
                   status=1 ;;
            esac
            POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache} "$tvenv/bin/python" -m pytest \
                -q -p no:cacheprovider "${torch_tests[@]/#/$root/tests/python/}" "$@"
            rc=$?  # 5: a -k filter left nothing in these files
            [ $rc = 0 ] || [ $rc = 5 ] || status=1
            echo "python: torch step (Debian's torch" \
                "$("$tvenv/bin/python" -c 'import torch; print(torch.__version__)')) took" \
                "$(( $(date +%s) - tstart )) s"
        else
            echo "python: pip install into $tvenv failed" >&2; status=1
        fi
    fi
    # Hugging Face transformers on clattn (test_transformers.py, test_compile*.py) with a
    # PyPI torch that transformers accepts, in BUILD_DIR/venv-python-hf: tests/python/run_hf.sh
    # (see its header; the venv is reused; the first run downloads about 5.3 GB).
    if [ "${CLATTN_PY_HF:-1}" = 0 ]; then
        echo "python: transformers step skipped (CLATTN_PY_HF=0)"
    else
        CLATTN_PY_SRC=$src CLATTN_CMAKE_ARGS=$cmake_args "$here/run_hf.sh" "$build" "$@" ||
            status=1
    fi
fi
echo "python lane$([ "$asan" = 1 ] && echo ' (asan)'): pytest exited $status after" \
    "$(( $(date +%s) - start )) s"
exit $status
