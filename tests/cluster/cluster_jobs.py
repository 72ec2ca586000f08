"""What the bed's tests launch and read back: LeNet's solver for training jobs, the local-rank worker."""
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCAL_RANK_WORKER = Path(__file__).resolve().parent / "workers" / "local_rank.py"
# One BLAS/numba thread per rank: 4 ranks already oversubscribe a 2-core machine.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def lenet_solver(tmp_path, test_interval):
    """The bundled LeNet solver, with paths that work from anywhere and snapshots into tmp_path."""
    text = (REPO / "examples" / "mnist" / "lenet_solver.prototxt").read_text()
    text = text.replace('snapshot_prefix: "examples/mnist/lenet"', f'snapshot_prefix: "{tmp_path}/lenet"')
    text = text.replace('net: "examples/mnist/lenet_train_test.prototxt"',
                        f'net: "{REPO}/examples/mnist/lenet_train_test.prototxt"')
    text = text.replace("test_interval: 500", f"test_interval: {test_interval}")
    solver = tmp_path / "solver.prototxt"
    solver.write_text(text)
    return solver


def local_ranks(job):
    """The local-rank worker's report: per host, sorted [local rank read before MPI, shared-memory rank]."""
    return json.loads(re.search(r"^LOCAL-RANKS (.*)$", job.stdout, re.M).group(1))
