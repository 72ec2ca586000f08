"""What every MPI worker script shares: start-up, the op and dtype tables, test data and exact checks.

A worker is one `mpiexec -n N python <script>` job. It checks many cases in one launch and dies loudly on
the first wrong result: the failing rank raises, `collectives.install_abort_hook()` aborts the whole job,
and the test sees a non-zero exit and the traceback on stderr. A job that does not finish is killed by the
test harness; shortly before that a watchdog prints, on every rank, the case it was stuck in.
"""
import argparse
import faulthandler
import os
import sys
import threading
import time

import numpy
from mpi4py import MPI

import collectives

SIGNED = [numpy.int8, numpy.int16, numpy.int32, numpy.int64]
UNSIGNED = [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64]
FLOATS = [numpy.float16, numpy.float32, numpy.float64]
COMPLEXES = [numpy.complex64, numpy.complex128]
ALL_DTYPES = [numpy.dtype(t) for t in SIGNED + UNSIGNED + FLOATS + COMPLEXES]

OPS = {
    "sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
    "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR,
    "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
}
LOGICAL = {"land": numpy.logical_and, "lor": numpy.logical_or, "lxor": numpy.logical_xor}
ARITHMETIC = {"sum": numpy.add, "prod": numpy.multiply, "min": numpy.minimum, "max": numpy.maximum,
              "band": numpy.bitwise_and, "bor": numpy.bitwise_or, "bxor": numpy.bitwise_xor}


def valid(op, dtype):
    """MPI's own rules (MPI 4.1, section 6.9.2), written out here so the oracle does not trust the code under test."""
    kind = numpy.dtype(dtype).kind
    if op in ("sum", "prod"):
        return kind in "iufc"
    if op in ("min", "max"):
        return kind in "iuf"
    return kind in "iu"  # logical and bitwise ops: integers


def dtype_list(spec):
    if spec == "all":
        return list(ALL_DTYPES)
    return [numpy.dtype(name) for name in spec.split(",")]


def op_list(spec):
    return list(OPS) if spec == "all" else spec.split(",")


def contribution(op, dtype, n, rank, seed):
    """Rank `rank`'s input for one case: small integers, so every sum and product is exact in any order.

    With at most 8 ranks: sums stay within +-32 (and 64 unsigned), products of {-1, 1} or {1, 2} within
    2**8 (unsigned products may wrap, which is defined, and numpy wraps the same way).
    """
    dtype = numpy.dtype(dtype)
    rng = numpy.random.default_rng([seed, rank])
    if op in ("band", "bor", "bxor"):  # every bit pattern
        return rng.integers(0, 256, size=n * dtype.itemsize, dtype=numpy.uint8).view(dtype).copy()
    if op in LOGICAL:
        values = rng.integers(0, 3, size=n)  # 0 is false; 1 and 2 are both true
    elif op == "prod":
        if dtype.kind == "u":
            values = rng.integers(1, 3, size=n)
        elif dtype.kind == "i":
            values = rng.choice([-1, 1], size=n)
        else:
            values = rng.choice([-1, 1, 2], size=n)
    elif op in ("min", "max"):
        values = rng.integers(0 if dtype.kind == "u" else -100, 101, size=n)
    else:  # sum, and any data for bcast
        values = rng.integers(0 if dtype.kind == "u" else -4, 5, size=n)
    out = values.astype(dtype)
    if dtype.kind == "c":
        if op == "prod":
            out = rng.choice(numpy.array([1, -1, 1j, -1j, 2], dtype=dtype), size=n)
        else:
            out = out + 1j * rng.integers(-4, 5, size=n).astype(dtype)
    return out


def expected_reduction(op, inputs):
    """inputs[0] op inputs[1] op ... with numpy, in MPI's result type (logical ops give 0/1).

    A single input is returned unchanged, even for logical ops: MPI applies the op only between two
    contributions, so on one rank MPICH's own Reduce(LAND) of [2] gives [2], not [1].
    """
    dtype = inputs[0].dtype
    if len(inputs) == 1:
        return inputs[0].copy()
    if op in LOGICAL:
        acc = inputs[0] != 0
        for a in inputs[1:]:
            acc = LOGICAL[op](acc, a != 0)
        return acc.astype(dtype)
    acc = inputs[0].copy()
    for a in inputs[1:]:
        ARITHMETIC[op](acc, a, out=acc)
    return acc


class HostInterfaceArray:
    """Host memory exported through `__cuda_array_interface__` only, like mpi4py's "fake GPU arrays" (and
    any program's arrays on a machine without a CUDA driver); `array` is the numpy array behind it."""

    def __init__(self, array, read_only=False, version=3):
        self.array = array
        interface = {"shape": array.shape, "typestr": array.dtype.str, "version": version,
                     "data": (array.ctypes.data, read_only)}
        if not array.flags.c_contiguous:
            interface["strides"] = array.strides
        self.__cuda_array_interface__ = interface


class DLPackArray:
    """Host memory exported through DLPack only (no buffer protocol); `array` is the numpy array behind it."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def check_each_setting(doc, name, check):
    """A worker's main: check(w) once per --settings of the command line (Worker.each_setting)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--settings", action="append", default=[], help="VAR=value,... for one more pass")
    Worker().each_setting(parser.parse_args().settings, name, check)


class Worker:
    """One rank of a worker job: the wrapped communicator, the case being checked, the final report."""

    def __init__(self, comm=None):
        collectives.install_abort_hook()
        self.world = MPI.COMM_WORLD
        self.comm = comm if comm is not None else collectives.Comm(MPI.COMM_WORLD)
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.current = "start-up"
        self.cases = 0
        self.started = time.monotonic()
        self._start_watchdog()

    def _start_watchdog(self):
        seconds = float(os.environ.get("SCAFFE_TEST_WATCHDOG_S", "0") or 0)
        if seconds <= 0:
            return

        def report():
            sys.stderr.write(f"[rank {self.rank}] still running after {seconds:.0f} s; "
                             f"current case: {self.current}\n")
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()

        timer = threading.Timer(seconds, report)
        timer.daemon = True
        timer.start()

    def case(self, description):
        self.current = description
        self.cases += 1

    def fail(self, message):
        raise AssertionError(f"[rank {self.rank} of {self.size}] {self.current}: {message}")

    def check(self, got, expected, what):
        """Exact comparison of two 1-D arrays (dtype, length and every element)."""
        got = numpy.asarray(got)
        if got.dtype != expected.dtype or got.shape != expected.shape:
            self.fail(f"{what}: got {got.shape} x {got.dtype}, expected {expected.shape} x {expected.dtype}")
        if not numpy.array_equal(got, expected):
            bad = numpy.flatnonzero(got != expected)
            first = int(bad[0])
            self.fail(f"{what}: {bad.size} of {got.size} elements differ; first at [{first}]: "
                      f"got {got[first]!r}, expected {expected[first]!r}")

    def check_true(self, condition, message):
        if not condition:
            self.fail(message)

    def check_raises(self, error_type, words, call):
        """call() must raise error_type with a message naming every one of `words` (case-insensitive)."""
        try:
            result = call()
        except error_type as error:
            text = str(error)
            missing = [word for word in words if word.lower() not in text.lower()]
            self.check_true(not missing, f"the message {text!r} does not mention {missing}")
        except Exception as error:
            self.fail(f"raised {type(error).__name__}: {error} instead of {error_type.__name__}")
        else:
            self.fail(f"no {error_type.__name__} raised on this rank (returned {result!r})")

    def check_in_step(self, after):
        """One correct Allreduce, checked: every rank is still in step `after` a failed call."""
        data = [contribution("sum", numpy.float64, 5003, r, self.cases) for r in range(self.size)]
        out = numpy.empty(5003)
        self.comm.Allreduce(data[self.rank], out, op=MPI.SUM)
        self.check(out, expected_reduction("sum", data), f"the correct Allreduce after {after}")

    def each_setting(self, settings, name, check):
        """check(self) once per VAR=value,... of `settings` (an empty value unsets VAR), each on a communicator
        of every rank made under them and checked to have the nodes and algorithm they ask for, the
        environment restored after it; once on self.comm where `settings` is empty. Each pass ends in
        done(): several topologies in one launch, whose start-up is most of what a small pass costs."""
        if not settings:
            check(self)
            self.done(name)
            return
        for one in settings:
            launched_with = dict(os.environ)
            self.comm = self._communicator_under(one)
            check(self)
            self.done(f"{name} [{one}]")
            self.comm.Free()
            os.environ.clear()
            os.environ.update(launched_with)

    def _communicator_under(self, settings):
        for item in settings.split(","):
            variable, value = item.split("=", 1)
            if value:
                os.environ[variable] = value
            else:
                os.environ.pop(variable, None)
        comm = collectives.Comm(MPI.COMM_WORLD.Dup())  # freed after its pass
        self.case(f"setting up under {settings}")
        comm.describe()  # sets it up, reading the settings
        per_node = int(os.environ.get("SCAFFE_RANKS_PER_NODE") or 0)
        nodes = -(-self.size // per_node) if per_node else 1  # one host here
        self.check_true(comm.node_topology.num_nodes == nodes, f"{comm.node_topology.num_nodes} nodes, not {nodes}")
        self.check_true(comm.forced == (os.environ.get("SCAFFE_REDUCE_ALGO") or None), f"algorithm {comm.forced}")
        return comm

    def each_on_its_communicator(self, work):
        """Runs each (function, arguments) of `work` (two of them) on a thread of its own, the first with this
        worker's communicator and the second with a Dup of it, both set up first, as the S-Caffe schedule's
        two communicators are used from their progress threads; returns the two communicators."""
        self.check_true(MPI.Query_thread() == MPI.THREAD_MULTIPLE, "two threads calling MPI need MPI_THREAD_MULTIPLE")
        comms = [self.comm, self.comm.Dup()]
        for comm in comms:
            comm.describe()  # set up here: it is collective over the communicator
        threads = [threading.Thread(target=function, args=(self, comm, *arguments))
                   for comm, (function, arguments) in zip(comms, work)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return comms

    def done(self, name):
        """Every rank got here: rank 0 prints the line the harness looks for."""
        self.current = "final barrier"
        self.world.Barrier()
        topo = self.comm.describe()  # collective if no call has set the communicator up yet
        counts = self.world.gather(self.cases, root=0)
        if self.rank == 0:
            print(f"WORKER-OK {name}: {sum(counts)} case-checks on {self.size} rank(s), {topo}, "
                  f"algo={os.environ.get('SCAFFE_REDUCE_ALGO', 'default')}, "
                  f"thread level {MPI.Query_thread()} (multiple={MPI.THREAD_MULTIPLE}), "
                  f"{time.monotonic() - self.started:.1f} s", flush=True)
