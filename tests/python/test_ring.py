"""clattn.ring_attention (libclattn_mpi through ctypes, mpi4py's communicators) under
`mpirun -np 2` and `-np 3`: tests/python/ring_worker.py checks every rank's rows against a
float64 reference (self-attention zig-zag causal, cross-attention with bottom-right causal, a
window and key padding, float16). Skipped where mpi4py, mpirun or libclattn_mpi is missing
(tests/python/run.sh points CLATTN_MPI_LIBRARY at the build's where it has one)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

import clattn


def _ready():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    if shutil.which("mpirun") is None:
        return "no mpirun"
    try:
        from clattn import ring
        ring._mpi_library()
    except (ImportError, OSError) as e:
        return str(e)
    return None


@pytest.mark.parametrize("ranks", [2, 3])
def test_ring_attention_ranks(ranks):
    why = _ready()
    if why:
        pytest.skip(why)
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ring_worker.py")
    done = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                           sys.executable, worker], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # Each rank prints "ring ok <rank> <cases>"; mpirun forwards the ranks' output as it
    # comes, and two lines were once joined ("ring ok 1 3ring ok 2 3"): count the ranks.
    oks = {int(rank) for rank in re.findall(r"ring ok (\d+) \d+", done.stdout)}
    assert oks == set(range(ranks)), done.stdout


def test_ring_attention_is_optional():
    """Importing clattn loads neither mpi4py nor libclattn_mpi."""
    code = "import sys, clattn; print('mpi4py' in sys.modules, 'lib' in clattn.ring._state)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"], done.stdout
    assert callable(clattn.ring_attention)
