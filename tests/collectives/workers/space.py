"""Checks Reduce, Allreduce and Bcast over the whole case space in one launch, against numpy, exactly.

The space, in the one loop of `main`: kind x (op x dtype) x size x root x in-place x completion mode,
where the completion mode is the blocking call, or the I* call finished by Wait, by a Test loop, or
(two calls in flight at once) by MPI.Request.Waitall. With --rotate, each (kind, op, dtype, size) gets
one (root, in-place, mode) drawn from a fixed-seed generator (the same on every rank), which covers those
three dimensions across the space at a fraction of the cost of crossing them.

    mpiexec -n 4 python space.py --ops all --dtypes all --sizes 0,1,7,1001,5003

Each --settings VAR=value,... (an empty value unsets VAR) adds one pass over the space, on a communicator
made under those settings (the collectives read them when a communicator is set up): several topologies in
one launch, each checked to be the one asked for before its pass. Each --pass "ARGS" runs this script's
ARGS (their own space, memory, name and settings) after the others in the same launch: a launch costs
every rank its start-up, which on a loaded 2-core machine is most of what a small pass costs.

--memory device puts every buffer on the GPU (numba device arrays; numba's CUDA simulator without a
GPU), --memory mixed a device send buffer with a host receive buffer on even ranks and the other way
round on odd ones. --memory interface passes host memory behind `__cuda_array_interface__` (mpi4py's
"fake GPU arrays"), --memory dlpack host memory behind DLPack as [buffer, MPI datatype].
"""
import argparse
import itertools
import shlex

import numpy
from mpi4py import MPI

from worker_util import (OPS, DLPackArray, HostInterfaceArray, Worker, contribution, dtype_list, expected_reduction,
                         op_list, valid)

MODES = ["blocking", "wait", "test", "waitall"]
KINDS = ["reduce", "allreduce", "bcast"]
SENTINEL = 0x5A  # byte pattern of buffers whose content must not change


def sentinel(dtype, n):
    return numpy.full(n * numpy.dtype(dtype).itemsize, SENTINEL, dtype=numpy.uint8).view(dtype)


MEMORY = "host"


def placed(array, role, rank):
    """`array` where --memory puts a buffer of this role ("send" or "recv") on this rank."""
    if array is None or array is MPI.IN_PLACE:
        return array
    if MEMORY == "interface":
        return HostInterfaceArray(array)
    if MEMORY == "dlpack":
        return [DLPackArray(array), MPI.Datatype.fromcode(array.dtype.char)]
    on_device = MEMORY == "device" or (MEMORY == "mixed" and (role == "send") == (rank % 2 == 0))
    if not on_device:
        return array
    from kernels.numba_cuda import cuda
    return cuda.to_device(array)


def on_host(buf):
    if isinstance(buf, list):  # a [buffer, datatype] spec
        buf = buf[0]
    if isinstance(buf, (HostInterfaceArray, DLPackArray)):
        return buf.array
    return buf if isinstance(buf, numpy.ndarray) else buf.copy_to_host()


class Case:
    """The buffers of one collective call on this rank and what they must hold afterwards."""

    def __init__(self, w, kind, op, dtype, n, root, inplace, seed):
        self._fill(w, kind, op, dtype, n, root, inplace, seed)
        moved = {id(self.send): placed(self.send, "send", w.rank), id(self.recv): placed(self.recv, "recv", w.rank)}
        self.send, self.recv = moved[id(self.send)], moved[id(self.recv)]
        self.untouched = [(moved.get(id(buf), buf), content) for buf, content in self.untouched or ()]

    def _fill(self, w, kind, op, dtype, n, root, inplace, seed):
        self.w, self.kind, self.op, self.root, self.inplace = w, kind, op, root, inplace
        rank, size = w.rank, w.size
        data_op = op if kind != "bcast" else "sum"
        inputs = [contribution(data_op, dtype, n, r, seed) for r in range(size)]
        mine = inputs[rank]
        self.send = self.recv = None
        self.expected = self.untouched = None  # (buffer, content) pairs checked after the call
        if kind == "bcast":
            self.recv = mine.copy() if rank == root else sentinel(dtype, n).copy()
            self.expected = inputs[root]
            return
        receives = kind == "allreduce" or rank == root
        if receives:
            self.expected = expected_reduction(op, inputs)
        if inplace and receives:
            self.send = MPI.IN_PLACE if seed % 2 else None  # mpi4py reads None as MPI.IN_PLACE
            self.recv = mine.copy()
        else:
            self.send = mine.copy()
            self.untouched = [(self.send, mine)]
            if receives:
                self.recv = sentinel(dtype, n).copy()
            elif seed % 2:  # a non-root may pass a receive buffer; it must stay as it was
                self.recv = sentinel(dtype, n).copy()
                self.untouched.append((self.recv, sentinel(dtype, n)))

    def start(self, blocking):
        comm, op = self.w.comm, OPS.get(self.op)
        if self.kind == "reduce":
            call = comm.Reduce if blocking else comm.Ireduce
            return call(self.send, self.recv, op=op, root=self.root)
        if self.kind == "allreduce":
            call = comm.Allreduce if blocking else comm.Iallreduce
            return call(self.send, self.recv, op=op)
        call = comm.Bcast if blocking else comm.Ibcast
        return call(self.recv, root=self.root)

    def verify(self):
        if self.expected is not None:
            self.w.check(on_host(self.recv), self.expected, "result")
        for buf, content in self.untouched:
            self.w.check(on_host(buf), content, "buffer that must not change")


def run(w, kind, op, dtype, n, root, inplace, mode, seed):
    w.case(f"{kind} op={op} dtype={dtype} n={n} root={root} inplace={inplace} mode={mode} seed={seed}")
    cases = [Case(w, kind, op, dtype, n, root, inplace, seed + k) for k in range(2 if mode == "waitall" else 1)]
    if mode == "blocking":
        cases[0].start(blocking=True)
    else:
        requests = [c.start(blocking=False) for c in cases]
        w.check_true(all(isinstance(r, MPI.Request) for r in requests), f"I* returned {requests!r}")
        if mode == "wait":
            requests[0].Wait()
        elif mode == "test":
            while not requests[0].Test():
                pass
        else:
            MPI.Request.Waitall(requests)
    for c in cases:
        c.verify()


def roots_for(spec, size):
    if spec == "all":
        return list(range(size))
    return sorted({0, 1 % size, size // 2, size - 1})


def parser_of_arguments():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--ops", default="all", help="'all' or a comma list of sum,prod,min,max,land,...")
    parser.add_argument("--dtypes", default="all", help="'all' or a comma list of numpy dtype names")
    parser.add_argument("--sizes", default="0,1,7,1001,5003", help="element counts")
    parser.add_argument("--roots", default="some", choices=["some", "all"])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rotate", action="store_true",
                        help="draw one (root, in-place, mode) per case from a fixed-seed generator "
                             "instead of crossing them")
    parser.add_argument("--memory", default="host", choices=["host", "device", "mixed", "interface", "dlpack"])
    parser.add_argument("--name", default="space")
    parser.add_argument("--settings", action="append", default=[],
                        help="VAR=value,... for one more pass on a communicator made under them (repeatable)")
    parser.add_argument("--pass", dest="passes", action="append", default=[],
                        help="this script's arguments for one more pass in this launch (repeatable)")
    return parser


def main():
    parser = parser_of_arguments()
    args = parser.parse_args()
    w = Worker()  # its communicator is set up at its first call: never, where --settings make others
    passes = [args] if not args.passes else []
    passes += [parser.parse_args(shlex.split(text)) for text in args.passes]
    if args.passes and not all(one.settings for one in passes):
        parser.error("every --pass makes its own communicators: give each its --settings")
    for one in passes:
        passes_of(w, one)


def passes_of(w, args):
    """The passes of one set of arguments: one per --settings, or one on the Worker's communicator."""
    global MEMORY
    MEMORY = args.memory
    w.each_setting(args.settings, args.name, lambda w: space(w, args))


def space(w, args):
    """One pass over the space on w.comm."""
    kinds = args.kinds.split(",")
    ops, dtypes = op_list(args.ops), dtype_list(args.dtypes)
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    roots = roots_for(args.roots, w.size)
    chooser = numpy.random.default_rng(12345)  # same sequence on every rank
    seed = 0

    for kind in kinds:
        pairs = [(None, d) for d in dtypes] if kind == "bcast" else \
            [(op, d) for op in ops for d in dtypes if valid(op, d)]
        for (op, dtype), n in itertools.product(pairs, sizes):
            variants = list(itertools.product(roots if kind != "allreduce" else [0],
                                              [False] if kind == "bcast" else [False, True], modes))
            if args.rotate:
                variants = [variants[chooser.integers(len(variants))]]
            for root, inplace, mode in variants:
                seed += 1
                run(w, kind, op, dtype, n, root, inplace, mode, seed)


if __name__ == "__main__":
    main()
