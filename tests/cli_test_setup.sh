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

# A refusal: `clattn ARGS...` exits with status WANT and writes exactly one stderr line, which
# holds WORD, and no file NEVER. Usage: cli_refuse NAME WANT WORD NEVER ARGS...
cli_refuse() {
    name=$1 want=$2 word=$3 never=$4
    shift 4
    "$clattn" "$@" >"$work/out.txt" 2>"$work/err.txt"
    status=$?
    lines=$(grep -c . "$work/err.txt")
    if [ "$status" -ne "$want" ] || [ "$lines" -ne 1 ] || ! grep -q -- "$word" "$work/err.txt" ||
        [ -e "$never" ]; then
        echo "FAIL refuse $name: status $status (want $want), $lines stderr lines:"
        cat "$work/out.txt" "$work/err.txt"
        fail=1
    else
        echo "ok   refuse $name: $(cat "$work/err.txt")"
    fi
}
