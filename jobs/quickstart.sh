#!/usr/bin/env bash
# Single host, from a fresh clone: make the virtual environment (once), build the bundled MNIST
# LMDBs (once), then train LeNet data-parallel on 2 MPI ranks with the S-Caffe schedule.
# Usage: bash jobs/quickstart.sh [ranks] [extra scaffe train flags...]   (default 2 ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-2}
shift || true
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e .
.venv/bin/python -c "from scaffe.tools.convert_mnist import ensure_mnist_lmdb; ensure_mnist_lmdb('examples/mnist')"
# One BLAS/numba thread per rank: the ranks already fill the cores.
export OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1
.venv/bin/mpiexec -n "$ranks" .venv/bin/scaffe train --solver=examples/mnist/lenet_solver.prototxt \
    --iterations=500 "$@"
