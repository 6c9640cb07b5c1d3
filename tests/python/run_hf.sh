#!/bin/bash
# Hugging Face transformers on clattn (tests/python/test_transformers.py, and any
# tests/python/test_compile*.py: torch.compile; test_flex.py: against torch's flex_attention;
# then the docs test on the pages whose examples need them) in a virtual environment of its own,
# BUILD_DIR/venv-python-hf, with a torch that transformers accepts. The python lane
# (tests/python/run.sh) runs it after its Debian-torch step; it also runs by hand:
#
#   tests/python/run_hf.sh BUILD_DIR [pytest options...]
#
# The venv (made on the first run, reused while it imports the pinned versions): torch from
# PyPI (its Linux wheel pulls CUDA's nvidia-* wheels, about 5.3 GB; the CPU-only index is not
# reachable from CI, and without them `import torch` fails on libcufile.so.0; nothing here
# uses CUDA), a pinned transformers, numpy, pytest and ml_dtypes. The clattn wheel goes in
# --no-deps from a read-only copy of the tracked files, as in run.sh (the copy run.sh made
# when it passes CLATTN_PY_SRC, else a fresh one in BUILD_DIR/python-src-readonly-hf).
# Prints the setup's and the tests' times; exits with pytest's status (5, nothing selected
# by a -k filter, counts as success). In this step the test module must not skip:
# CLATTN_PY_HF_REQUIRED=1 makes a failed transformers import an error.
set -u -o pipefail
build=$(cd "${1:?usage: tests/python/run_hf.sh BUILD_DIR [pytest options...]}" && pwd) || exit 2
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$build/venv-python-hf
pins=(torch==2.15.0 transformers==5.25.0 numpy==2.4.6 pytest==9.2.0 ml_dtypes==0.7.0)
start=$(date +%s)
want=$(printf '%s\n' "${pins[@]}" | LC_ALL=C sort)
have() {  # the pinned packages' installed versions, as name==version lines
    "$venv/bin/python" - "${pins[@]}" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version
for pin in sorted(sys.argv[1:]):
    name = pin.split("==")[0]
    print(f"{name}=={version(name)}")
EOF
}
if [ ! -x "$venv/bin/python" ] || [ "$(have)" != "$want" ] ||
    ! "$venv/bin/python" -c 'import torch, transformers, numpy, pytest, ml_dtypes' 2>/dev/null; then
    { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
        "$venv/bin/pip" install -q "${pins[@]}" || {
        echo "python-hf: cannot set up $venv (python3-venv, PyPI, about 5.3 GB of disk)" >&2
        exit 1
    }
fi
venv_s=$(( $(date +%s) - start ))
src=${CLATTN_PY_SRC:-}
if [ -z "$src" ]; then
    src=$build/python-src-readonly-hf
    { [ ! -e "$src" ] || { chmod -R u+w "$src" && rm -rf "$src"; }; } && mkdir -p "$src" &&
        (cd "$root" && git ls-files -z | xargs -0 cp -a --parents -t "$src") &&
        chmod -R a-w "$src" || { echo "python-hf: cannot make a read-only copy of $root" >&2; exit 1; }
fi
env -u CLATTN_BUILD_DIR XDG_CACHE_HOME="$build/python-cache" \
    CLATTN_CMAKE_ARGS=${CLATTN_CMAKE_ARGS:-} "$venv/bin/pip" install -q --force-reinstall \
    --no-deps "$src" || { echo "python-hf: pip install of clattn into $venv failed" >&2; exit 1; }
setup=$(( $(date +%s) - start ))
# test_flex.py: clattn.flex_attention against torch's own flex_attention (which Debian's
# torch lacks: those cases skip in run.sh's steps)
tests=("$root/tests/python/test_transformers.py" "$root/tests/python/test_flex.py")
for f in "$root"/tests/python/test_compile*.py; do
    [ -e "$f" ] && tests+=("$f")
done
tstart=$(date +%s)
cd "$build" || exit 1
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CLATTN_PY_HF_REQUIRED=1 \
    POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache} "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider "${tests[@]}" "$@"
status=$?
[ $status = 5 ] && status=0
# The docs' torch, transformers and torch.compile examples (the docs test skips them on
# Debian's torch in the pocl lane): README.md and docs/python.md, run with this venv.
if [ -x "$build/clattn" ]; then
    POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache} "$venv/bin/python" \
        "$root/tests/docs/run_docs_test.py" "$build" --only README.md docs/python.md \
        docs/training.md || status=1
fi
echo "python-hf: setup $setup s (venv $venv_s s, clattn wheel $(( setup - venv_s )) s), tests $(( $(date +%s) - tstart )) s (torch" \
    "$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)," \
    "transformers $("$venv/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null))"
exit $status
