"""Device-buffer Reduce, Allreduce and Bcast on the CPU stand-in device (tests/stand_ins/cpu_device.py),
against numpy, exactly: the direct path (collectives.devices.ipc) with its synchronisation.

Every (op, dtype) pair MPI defines runs as a Reduce and an Allreduce, every dtype as a Bcast; size, root,
in-place, blocking or I* and the caller's stream (its own or the default) rotate over the cases. Each
rank writes its input on the caller's stream just before the call (queued, so it lands later) and
checks its buffers as soon as the call returns, without synchronising anything: a call that does not
order itself after the caller's work, or returns before its kernels have run, gives wrong results.

    mpiexec -n 4 python device_ipc.py --gpus distinct [--forget caller|done] [--expect staged]

--gpus: which stand-in GPU each rank uses: shared (all one), distinct (one each), pairs (two per GPU).
--forget plants a missing wait (ForgetfulDevice below); the job must then fail.
--memory cupy runs the same cases on cupy arrays on the real GPUs (local rank % GPUs), where a check
reads its buffer with cupy's get(), which waits for the legacy default stream only. It refuses to run on
arrays that are not device memory (the numpy-backed cupy of tests/stand_ins, say): every case would then
pass on the host path and prove nothing about the direct one.
"""
import argparse
import itertools
import sys
from pathlib import Path

import numpy
from mpi4py import MPI

# Appended, not prepended: tests/stand_ins holds a numpy-backed `cupy` too, which must not hide the real
# one (it did, and --memory cupy then ran every case on host memory: "0 of 31 calls took the direct path").
sys.path.append(str(Path(__file__).resolve().parents[2] / "stand_ins"))

import collectives  # noqa: E402
import cpu_device  # noqa: E402
from collectives.devices import peers  # noqa: E402
from worker_util import OPS, Worker, contribution, dtype_list, expected_reduction, op_list, valid  # noqa: E402

SIZES = [1, 333, 5003]  # 5003 float64s make a slice for each of 4 owners (slices are 256-byte aligned)
SEED = 7


FORGETFUL_ROUNDS = 10


class ForgetfulDevice(cpu_device.CpuDevice):
    """A stand-in device with a planted bug: it drops one kind of wait. "caller": a rank's host wait for
    the caller's stream before it says its buffers are ready; "done": an owner's host wait for its kernel
    before it says the results are in place."""

    def __init__(self, forget, **kwargs):
        super().__init__(**kwargs)
        self.forget = forget

    def synchronize(self, event):
        if self.forget != "caller":
            super().synchronize(event)

    def synchronize_stream(self, stream):
        if self.forget != "done":
            super().synchronize_stream(stream)


def gpu_of(local_rank, layout):
    return {"shared": 0, "distinct": local_rank, "pairs": local_rank // 2}[layout]


class StandInMemory:
    """Buffers on the stand-in device; `peek` reads them without waiting for anything."""

    def __init__(self, device):
        self.device = device

    def array(self, n, dtype):
        return self.device.array((n,), dtype)

    def stream(self):
        return self.device.new_stream()

    def write(self, buf, values, stream):
        buf.write(values, stream)

    def peek(self, buf):
        return buf.peek()


class CupyMemory:
    """Buffers on this rank's GPU as cupy arrays."""

    def __init__(self, local_rank):
        import cupy
        from collectives.devices.memory import is_device_buffer
        self.cupy = cupy
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
        if not is_device_buffer(cupy.empty(1)):
            raise SystemExit(f"--memory cupy: the cupy imported from {cupy.__file__} makes arrays in host memory; "
                             "the direct path needs a real GPU")

    def array(self, n, dtype):
        return self.cupy.empty(n, dtype)

    def stream(self):
        return self.cupy.cuda.Stream(non_blocking=True)

    def write(self, buf, values, stream):
        buf.set(numpy.ascontiguousarray(values), stream=stream)

    def peek(self, buf):
        return buf.get()


class Runner:
    def __init__(self, w, memory):
        self.w, self.memory = w, memory
        self.streams = [None, memory.stream()]
        self.rotation = itertools.count()
        self.calls = 0  # those that must take the direct path

    def choose(self, options):
        return options[next(self.rotation) % len(options)]

    def call(self, name, *args, stream):
        """The collective `name` (blocking, or its I* form finished by Wait), on `stream`."""
        comm = self.w.comm
        if self.choose([False, True]):
            getattr(comm, "I" + name.lower())(*args, stream=stream).Wait()
        else:
            getattr(comm, name)(*args, stream=stream)

    def reduction(self, kind, op, dtype, n, root, in_place, stream):
        w, rank = self.w, self.w.rank
        self.w.case(f"{kind} {op} {dtype} n={n} root={root} in_place={in_place} stream={stream is not None}")
        inputs = [contribution(op, dtype, n, r, w.cases) for r in range(w.size)]
        expected = expected_reduction(op, inputs)
        receives = kind == "allreduce" or rank == root
        memory = self.memory
        send = memory.array(n, dtype)
        recv = memory.array(n, dtype) if receives else None
        if in_place and receives:
            memory.write(recv, inputs[rank], stream)
            send = MPI.IN_PLACE
        else:
            memory.write(send, inputs[rank], stream)
            if receives:
                memory.write(recv, numpy.zeros(n, dtype), stream)
        if kind == "reduce":
            self.call("Reduce", send, recv, OPS[op], root, stream=stream)
        else:
            self.call("Allreduce", send, recv, OPS[op], stream=stream)
        self.calls += n > 0  # empty buffers are staged
        if receives:
            w.check(memory.peek(recv), expected, "result")
        if send is not MPI.IN_PLACE:
            w.check(memory.peek(send), inputs[rank], "send buffer (must be left as it was)")

    def bcast(self, dtype, n, root, stream):
        w = self.w
        w.case(f"bcast {dtype} n={n} root={root} stream={stream is not None}")
        data = contribution("sum", dtype, n, root, w.cases)
        buf = self.memory.array(n, dtype)
        self.memory.write(buf, data if w.rank == root else numpy.zeros(n, dtype), stream)
        self.call("Bcast", buf, root, stream=stream)
        self.calls += n > 0
        w.check(self.memory.peek(buf), data, "broadcast buffer")

    def repeated(self, dtype=numpy.float32, n=2048, times=4):
        """The same buffers again and again: their handles are opened once (the registration cache)."""
        w, memory = self.w, self.memory
        send, recv = memory.array(n, dtype), memory.array(n, dtype)
        opened = []
        for time in range(times):
            w.case(f"repeated allreduce {time}")
            inputs = [contribution("sum", dtype, n, r, w.cases) for r in range(w.size)]
            memory.write(send, inputs[w.rank], None)
            w.comm.Allreduce(send, recv, MPI.SUM)
            self.calls += 1
            w.check(memory.peek(recv), expected_reduction("sum", inputs), "result")
            opened.append(sum(cache.opens for cache in peers._caches.values()))
        w.check_true(opened[-1] == opened[0], f"handles were opened again for the same buffers: {opened}")
        plans = w.comm.device_ipc.plans_made
        for time in range(times):
            w.case(f"repeated allreduce {time}, plan kept")
            memory.write(send, numpy.full(n, time + w.rank, dtype), None)
            w.comm.Allreduce(send, recv, MPI.SUM)
            self.calls += 1
            w.check(memory.peek(recv), numpy.full(n, sum(time + r for r in range(w.size)), dtype), "result")
        w.check_true(w.comm.device_ipc.plans_made == plans, "a repeated call made a new plan")
        for time in range(times):
            w.case(f"repeated in-place allreduce {time}")
            memory.write(recv, numpy.full(n, time * w.rank, dtype), None)
            w.comm.Allreduce(MPI.IN_PLACE, recv, MPI.SUM)
            self.calls += 1
            w.check(memory.peek(recv), numpy.full(n, sum(time * r for r in range(w.size)), dtype), "result")
        w.check_true(w.comm.device_ipc.plans_made == plans + 1, "repeated in-place calls made new plans")

    def reallocated(self, dtype=numpy.int64, n=700, times=4, growth=1):
        """Buffers freed and allocated again between calls, as numba allocates: a new allocation where freed
        ones were comes with a new handle, and the stale mappings must be closed before it is opened. With
        `growth` 2 the sizes double, as in an OSU sweep, and a new allocation covers two freed ones.
        Returns how many calls had a buffer at a freed one's address."""
        w, memory = self.w, self.memory
        seen = set()
        reused = 0
        for time in range(times):
            w.case(f"reallocated buffers {time}, growth {growth}")
            send, recv = memory.array(n * growth ** time, dtype), memory.array(n * growth ** time, dtype)
            addresses = {getattr(buf, "address", None) and buf.address.value for buf in (send, recv)}
            reused += bool(addresses & seen)
            seen |= addresses
            inputs = [contribution("sum", dtype, n * growth ** time, r, w.cases) for r in range(w.size)]
            memory.write(send, inputs[w.rank], None)
            w.comm.Allreduce(send, recv, MPI.SUM)
            self.calls += 1
            w.check(memory.peek(recv), expected_reduction("sum", inputs), "result")
            del send, recv
        return reused


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", choices=["shared", "distinct", "pairs"], default="shared")
    parser.add_argument("--forget", choices=["caller", "done"])
    parser.add_argument("--expect", choices=["direct", "staged"], default="direct")
    parser.add_argument("--memory", choices=["stand-in", "cupy"], default="stand-in")
    parser.add_argument("--path-argument", action="store_true",
                        help="ask for the --expect path with Comm's device_path, not SCAFFE_DEVICE_PATH")
    parser.add_argument("--ops", default="all")
    parser.add_argument("--dtypes", default="all")
    args = parser.parse_args()
    local_rank = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    if args.memory == "cupy":
        memory = CupyMemory(local_rank)
    else:
        options = dict(gpu=gpu_of(local_rank, args.gpus), seed=SEED + MPI.COMM_WORLD.Get_rank())
        device = ForgetfulDevice(args.forget, **options) if args.forget else cpu_device.CpuDevice(**options)
        cpu_device.register(device)
        memory = StandInMemory(device)
    w = Worker(collectives.Comm(MPI.COMM_WORLD, device_path=args.expect) if args.path_argument else None)
    direct = args.expect == "direct"
    w.check_true(bool(w.comm.describe()) and (w.comm.device_ipc is not None) == direct,
                 f"SCAFFE_DEVICE_PATH should have given the {args.expect} path")
    runner = Runner(w, memory)
    dtypes = dtype_list(args.dtypes)
    # A planted missing wait shows only when a random delay makes data land late: the cases run again
    # until it does (the first wrong element ends the job), so the test never passes it by luck.
    for _ in range(FORGETFUL_ROUNDS if args.forget else 1):
        for op, dtype in ((op, dtype) for dtype in dtypes for op in op_list(args.ops) if valid(op, dtype)):
            for kind in ("reduce", "allreduce"):
                runner.reduction(kind, op, dtype, runner.choose(SIZES), runner.choose(range(w.size)),
                                 runner.choose([False, True, False]), runner.choose(runner.streams))
        for dtype in dtypes:
            runner.bcast(dtype, runner.choose(SIZES), runner.choose(range(w.size)), runner.choose(runner.streams))
    runner.reduction("allreduce", "sum", numpy.dtype(numpy.int32), 0, 0, False, None)
    if direct:
        runner.repeated()
        reused = runner.reallocated(), runner.reallocated(growth=2)
        w.check_true(args.memory == "cupy" or all(reused),
                     f"no address was reused in one of the reallocation cases ({reused}): it tested nothing")
        w.check_true(w.comm.device_ipc.calls == runner.calls,
                     f"{w.comm.device_ipc.calls} of {runner.calls} calls took the direct path")
    w.done(f"device-ipc-{args.memory}-{args.gpus}")


if __name__ == "__main__":
    main()
