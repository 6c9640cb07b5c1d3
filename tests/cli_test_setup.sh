# Sourced (`. "$(dirname "$0")/cli_test_setup.sh"`) by the cli_*_test.sh scripts that check
# `clattn` against a float64 numpy reference, from their own arguments CLATTN [PYTHON]: sets
# clattn and python (default /usr/bin/python3; exit 77, skipped, when it has no numpy), makes
# $work (removed at exit), sets fail=0 and puts tests/ on PYTHONPATH, so the references the
# scripts write into $work import the shared tests/cli_reference.py.
clattn=$1 python=${2:-/usr/bin/python3}
"$python" -c 'import numpy' 2>/dev/null || { echo "SKIP: no numpy for $python"; exit 77; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
PYTHONPATH=$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
