"""A `scaffe train` job in the background (alone or under mpiexec) that a test can watch and signal.

The root's log is read as it comes (a thread drains the pipe, so the job never blocks on it); a test
waits for a line, signals the launcher or one rank, and waits for the end with a deadline.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def _is_open_mpi():
    try:
        return "Open MPI" in subprocess.run([str(MPIEXEC), "--version"], capture_output=True, text=True,
                                            timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


OPEN_MPI = _is_open_mpi()
# Where each launcher tells a rank its number.
RANK_VARIABLE = "OMPI_COMM_WORLD_RANK" if OPEN_MPI else "PMI_RANK"

ITERATION = r"\] Iteration (\d+) \("  # a display line of the solver

# A one-layer classifier on the bundled MNIST: many fast iterations, so signals land mid-training.
TINY_NET = """
name: "tiny"
layer {{ name: "mnist" type: "Data" top: "data" top: "label" include {{ phase: TRAIN }}
  transform_param {{ scale: 0.00390625 }} data_param {{ source: "{train}" batch_size: {batch} backend: LMDB }} }}
layer {{ name: "mnist" type: "Data" top: "data" top: "label" include {{ phase: TEST }}
  transform_param {{ scale: 0.00390625 }} data_param {{ source: "{test}" batch_size: 50 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" include {{ phase: TEST }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""

TINY_SOLVER = """
net: "{net}"
base_lr: 0.01
momentum: 0.9
lr_policy: "fixed"
display: {display}
max_iter: {max_iter}
snapshot: 0
snapshot_prefix: "{prefix}"
random_seed: 1
{extra}
"""


def write_tiny_solver(folder, batch=16, max_iter=100000, display=1, extra=""):
    """Solver and net files in `folder`; snapshots go to folder/tiny_iter_N.*."""
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    train, test = ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))
    net = Path(folder) / f"tiny_{batch}.prototxt"
    net.write_text(TINY_NET.format(train=os.path.abspath(train), test=os.path.abspath(test), batch=batch))
    solver = Path(folder) / f"solver_{batch}.prototxt"
    solver.write_text(TINY_SOLVER.format(net=net, display=display, max_iter=max_iter,
                                         prefix=Path(folder) / "tiny", extra=extra))
    return solver


class Job:
    """`scaffe ARGS` on `ranks` ranks (1: no launcher), started at once."""

    def __init__(self, ranks, args, env=None):
        launcher = [str(MPIEXEC), "-n", str(ranks)] + (["--oversubscribe"] if OPEN_MPI else [])
        cmd = (launcher if ranks > 1 else []) + [sys.executable, "-m", "scaffe"] + list(args)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1", **(env or {}))
        if OPEN_MPI:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.ranks = ranks
        self.lines = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def log(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout=120, start=0):
        """The first match of regex `pattern` in a log line from line `start` on (its index, match)."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._changed:
            while True:
                for index in range(start, len(self.lines)):
                    found = regex.search(self.lines[index])
                    if found:
                        return index, found
                if self.process.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"the job ended before logging {pattern!r}:\n{self.log[-3000:]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} in the log after {timeout} s:\n{self.log[-3000:]}")
                self._changed.wait(min(left, 1.0))

    def iteration(self, start=0, timeout=120):
        """The number of the first 'Iteration N (' display line from log line `start` on, and its line."""
        index, found = self.wait_for(ITERATION, timeout, start)
        return int(found.group(1)), index

    def reached(self, start, end):
        """The last iteration displayed in log lines [start, end): where a job may have been when something
        the test did after reading line `start` took effect (the log is read behind the job)."""
        return max(int(found.group(1)) for line in self.lines[start:end] if (found := re.search(ITERATION, line)))

    def rank_pid(self, rank):
        """The process id of rank `rank` (the launcher's descendant that has that rank number)."""
        if self.ranks == 1:
            return self.process.pid
        for pid in descendants(self.process.pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if (f"{RANK_VARIABLE}={rank}".encode() in environ
                    and b"scaffe" in Path(f"/proc/{pid}/cmdline").read_bytes()):
                return pid
        raise AssertionError(f"no process of rank {rank} under {self.process.pid}")

    def signal_rank(self, rank, sig):
        os.kill(self.rank_pid(rank), sig)

    def signal_launcher(self, sig):
        self.process.send_signal(sig)

    def finish(self, timeout):
        """Waits at most `timeout` s for the job to end (killing it after) and returns its exit status."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not end within {timeout} s:\n{self.log[-3000:]}") from None
        finally:
            self._reader.join(10)

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        return False


def descendants(pid):
    """Ids of every process below `pid` (from /proc's parent links)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
