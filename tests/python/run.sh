#!/bin/bash
# The Python package's lane: a virtual environment BUILD_DIR/venv-python (made on the first
# run: numpy, pytest, hypothesis, ml_dtypes from PyPI and the newest torch from PyTorch's CPU
# index; never pip-install them system-wide, that shadows Debian's numpy), `pip install .`
# through the in-tree backend (python/build_backend: CMake builds libclattn into the wheel,
# offline), then pytest on tests/python from outside the source tree, so the installed wheel
# is what runs. Prints its time; exits with pytest's status.
#
#   tests/python/run.sh BUILD_DIR [pytest options...]
set -u -o pipefail
build=$(cd "${1:?usage: tests/python/run.sh BUILD_DIR [pytest options...]}" && pwd) || exit 2
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$build/venv-python
start=$(date +%s)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, pytest, hypothesis' \
        2>/dev/null; then
    python3 -m venv "$venv" &&
        "$venv/bin/pip" install -q -r "$here/requirements.txt" &&
        "$venv/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu || {
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
