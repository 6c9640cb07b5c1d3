#!/bin/bash
# The Python package's lane: a virtual environment BUILD_DIR/venv-python (made on the first
# run: numpy, pytest, hypothesis, ml_dtypes from PyPI; never pip-install them system-wide, that
# shadows Debian's numpy), `pip install .` through the in-tree backend (python/build_backend:
# CMake builds libclattn into the wheel, offline), then pytest on tests/python from outside
# the source tree, so the installed wheel is what runs. Prints its time; exits with pytest's
# status.
#
#   tests/python/run.sh BUILD_DIR [pytest options...]
#
# torch is not installed: its Linux wheels on PyPI carry CUDA (gigabytes), and PyTorch's CPU
# index is not reachable from CI; test_torch.py then skips, and the float64 references carry
# the lane. CLATTN_PY_VENV=DIR uses an existing venv instead (e.g. one with torch, such as
# bench/peers.sh's /work/venv-peers): pytest and hypothesis are added to it if missing.
set -u -o pipefail
build=$(cd "${1:?usage: tests/python/run.sh BUILD_DIR [pytest options...]}" && pwd) || exit 2
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${CLATTN_PY_VENV:-$build/venv-python}
start=$(date +%s)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import numpy, pytest, hypothesis' \
        2>/dev/null; then
    { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
        "$venv/bin/pip" install -q -r "$here/requirements.txt" || {
        echo "python: cannot set up $venv (python3-venv, and PyPI for the test packages)" >&2
        exit 1
    }
fi
CLATTN_BUILD_DIR=$build/python-wheel "$venv/bin/pip" install -q --force-reinstall --no-deps \
    "$root" || { echo "python: pip install . failed" >&2; exit 1; }
cd "$build" || exit 1
POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache} "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider "$root/tests/python" "$@"
status=$?
echo "python lane: pytest exited $status after $(( $(date +%s) - start )) s"
exit $status
