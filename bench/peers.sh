#!/bin/sh
# clattn against PyTorch (CPU), numpy/OpenBLAS and CLBlast on the same PoCL device, one run,
# same sizes, 2 threads for every peer (issue 10). Prints one markdown table with the ratios,
# the targets met or not, and the growth exponents over L. Progress goes to stderr.
#
#   bench/peers.sh [--quick] [--runs N] [--only attention,gqa,mha,matmul,softmax] [--markdown FILE]
#                  [--json FILE] [--clattn BIN] [--clblast BIN] [--clblast-tuned DIR]
#
# --quick: fewer sizes, 3 runs (a few minutes on 2 cores); default: the issue's sizes, median
# of 5 runs after 3 warm-up runs (long on 2 cores: attention reaches L = 8192).
#
# Environment (defaults in brackets):
#   CLATTN_BIN     the clattn command [build/clattn]
#   CLBLAST_BENCH  bench/peer_clblast built with -DCLATTN_BENCH_CLBLAST=ON [build/peer_clblast
#                  if present, else no CLBlast column]
#   CLBLAST_TUNED  folder with CLBlast's tuner output (clblast_xgemm_*_32.json) [none: CLBlast's
#                  built-in parameters]; its best parameters reach CLBlast through
#                  CLBlastOverrideParameters
#   PEERS_VENV     the virtual environment with torch, numpy, threadpoolctl [/work/venv-peers]
#   PEERS_THREADS  threads per peer [2]
#
# One-time setup (never install torch system-wide: it shadows Debian's numpy):
#   python3 -m venv /work/venv-peers
#   /work/venv-peers/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu \
#     || /work/venv-peers/bin/pip install torch
#   /work/venv-peers/bin/pip install numpy threadpoolctl
#   apt-get install -y libclblast-dev clblast-utils      # CLBlast and its tuners
#   cmake -S . -B build -DCLATTN_BENCH_CLBLAST=ON && cmake --build build -j2
#   mkdir -p build/clblast-tuned && cd build/clblast-tuned
#   export OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd        # PoCL as platform 0
#   clblast_tuner_xgemm -platform 0 -device 0 -precision 32 -fraction 2000
#   timeout 600 clblast_tuner_xgemm_direct -platform 0 -device 0 -precision 32 \
#     -m 1024 -n 1024 -k 1024      # stage 1 (46 configurations) writes its JSON; stop in stage 2
#   (they write clblast_xgemm_*_32.json. CLBlast 1.5's -fraction is a divisor, not a fraction:
#   2000 skips the exhaustive stages and samples 60 + 8 configurations of the random ones at
#   1024³, about 10 minutes on 2 cores; the default (1) runs all 578 of stage 1, about an hour.
#   A value below 1 pads the search with empty configurations. Tune at 1024³: on PoCL the best
#   kernel at 256³ is one of the slowest at 1024³.)
# then, on an idle machine:
#   CLBLAST_TUNED=build/clblast-tuned bench/peers.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${PEERS_VENV:-/work/venv-peers}
threads=${PEERS_THREADS:-2}
python=python3
if [ -x "$venv/bin/python" ]; then
    python=$venv/bin/python
else
    echo "peers.sh: no virtual environment at $venv (PEERS_VENV): using $(command -v python3)" >&2
fi
: "${CLATTN_BIN:=build/clattn}"
if [ -z "${CLBLAST_BENCH:-}" ] && [ -x build/peer_clblast ]; then
    CLBLAST_BENCH=build/peer_clblast
fi
# The thread counts must be set before numpy and torch load their thread pools.
OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
    CLATTN_BIN=$CLATTN_BIN CLBLAST_BENCH=${CLBLAST_BENCH:-} CLBLAST_TUNED=${CLBLAST_TUNED:-} \
    exec "$python" "$here/peers.py" --threads "$threads" "$@"
