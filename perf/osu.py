"""Shared driver of the OSU-style collective benchmarks: OSU's flags, OSU's output, native vs scaffe.

Timing follows the OSU Micro-Benchmarks: a barrier, then `iterations` back-to-back calls after
`warmup` untimed ones; each rank's mean time is averaged over ranks (Avg), with the extremes over
ranks (Min, Max). `--impl both` measures the wrapped MPI and scaffe in the same run, alternating in
rounds (ROUNDS) so that drifting machine load hits both alike, and adds their ratio. The bandwidth floor is
numpy combining the same number of buffers on one core, what the memory system allows.

`-d cuda` puts the buffers on the GPU as numba device arrays, `-d cupy` as cupy arrays. There `--impl
staged` is scaffe's own staged device path (SCAFFE_DEVICE_PATH=staged: whole buffers through pinned host
memory), the baseline the direct device path must beat, `native` hands MPI the device pointers (only with
a CUDA-aware MPI, as `collectives.info.cuda_aware` finds or `SCAFFE_CUDA_AWARE=1` says: anything else
would crash), and `both` compares staged with scaffe.
"""
import argparse
import functools
import sys
import time

import numpy
from mpi4py import MPI

import collectives
from collectives.info import cuda_aware
from kernels.backend import get_array_module

DTYPES = {"float": (numpy.float32, "MPI_FLOAT"), "double": (numpy.float64, "MPI_DOUBLE"),
          "int": (numpy.int32, "MPI_INT"), "char": (numpy.int8, "MPI_CHAR")}
DEVICES = ("cuda", "cupy")  # device buffers: numba device arrays, cupy arrays
LARGE_MESSAGE = 8192  # OSU's boundary for fewer iterations
# `--impl both` splits each size's iterations into rounds in the order AB BA AB BA: slow drifts in machine
# load hit both alike, and so does whatever going first or second costs (perf/RESULTS.md).
ROUNDS = 4


def parse_size_range(text):
    lo, _, hi = text.rpartition(":")
    return (int(lo) if lo else 4), int(hi)


def parse_args(description, argv=None):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-m", "--message-size", default="4:1048576", help="[min:]max message size in bytes")
    p.add_argument("-i", "--iterations", type=int, default=None, help="timed iterations per size")
    p.add_argument("-x", "--warmup", type=int, default=None, help="untimed warm-up iterations per size")
    p.add_argument("-f", "--full", action="store_true", help="print Min, Max and Iterations too")
    p.add_argument("-c", "--validation", action="store_true", help="check every result")
    p.add_argument("-d", "--device", choices=["cpu", *DEVICES], default="cpu",
                   help="buffer location: host, or the GPU as numba (cuda) or cupy arrays")
    p.add_argument("-T", "--type", choices=sorted(DTYPES), default="float", help="element type")
    p.add_argument("--impl", choices=["native", "staged", "scaffe", "both"], default="both",
                   help="both: native (or staged, on the GPU) and scaffe side by side")
    p.add_argument("--alloc", action="store_true", help="scaffe uses comm.alloc (shared-memory) buffers")
    p.add_argument("--floor", action="store_true", help="add the single-core numpy bandwidth floor column")
    p.add_argument("--plot", metavar="FILE.png", help="draw latency against size")
    p.add_argument("--nonblocking", action="store_true",
                   help="time the I* form, each request waited for at once (OSU's osu_i* without the compute)")
    args = p.parse_args(argv)
    args.min_size, args.max_size = parse_size_range(args.message_size)
    if args.device == "cpu" and args.impl == "staged":
        p.error("--impl staged is the host-staging baseline for -d cuda or -d cupy")
    aware, why = cuda_aware() if args.device in DEVICES and args.impl == "native" else (True, "")
    if not aware:
        p.error(f"--impl native -d cuda hands device pointers to MPI, which crashes a non-CUDA-aware MPI "
                f"(this one is not, by {why}); set SCAFFE_CUDA_AWARE=1 if it is, or use --impl staged")
    if args.device in DEVICES and args.alloc:
        p.error("--alloc gives host shared memory; it does not combine with device buffers")
    return args


def staged_comm(world):
    """scaffe's Comm on its staged device path."""
    return collectives.Comm(world, device_path="staged")


def on_host(buf):
    """A numpy view or copy of a benchmark buffer, wherever it lives."""
    if isinstance(buf, numpy.ndarray):
        return buf
    return buf.get() if get_array_module(buf) is not numpy else buf.copy_to_host()


def sizes(args, itemsize):
    size = max(args.min_size, itemsize)
    while size <= args.max_size:
        yield size
        size *= 2


def iterations_for(args, size):
    """OSU's defaults (1000/100 small, 100/10 large), fewer still for multi-MiB messages."""
    if args.iterations is not None:
        return args.iterations, (args.warmup if args.warmup is not None else max(1, args.iterations // 10))
    if size <= LARGE_MESSAGE:
        iters, warm = 1000, 100
    elif size < (1 << 20):
        iters, warm = 100, 10
    else:
        iters, warm = max(5, int(100 * (1 << 20) / size) + 4), 2
    return iters, (args.warmup if args.warmup is not None else warm)


def time_calls(comm, call, iterations, warmup):
    for _ in range(warmup):
        call()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    return (time.perf_counter() - start) / iterations


def across_ranks(comm, seconds):
    """(avg, min, max) of a per-rank time over all ranks, in microseconds."""
    t = numpy.array([seconds * 1e6])
    total, low, high = numpy.empty(1), numpy.empty(1), numpy.empty(1)
    comm.Allreduce(t, total, op=MPI.SUM)
    comm.Allreduce(t, low, op=MPI.MIN)
    comm.Allreduce(t, high, op=MPI.MAX)
    return total[0] / comm.Get_size(), low[0], high[0]


def bandwidth_floor(count, dtype, inputs):
    """Seconds for numpy to combine `inputs` local buffers of `count` elements on this core."""
    from kernels.reduce import reduce_into
    bufs = [numpy.ones(count, dtype) for _ in range(max(inputs, 2))]
    out = numpy.empty(count, dtype)
    reduce_into(out, bufs, "sum")
    start = time.perf_counter()
    reps = 3
    for _ in range(reps):
        reduce_into(out, bufs, "sum")
    return (time.perf_counter() - start) / reps


def output_columns(args, impls, baseline):
    """(title, width, value(stats, iterations, floor) -> text) for each column after the size.

    stats maps an implementation to its (avg, min, max) latency in microseconds.
    """
    columns = []
    for impl in impls:
        label = "" if len(impls) == 1 else f" {impl}"
        shown = [("Avg", 0), ("Min", 1), ("Max", 2)] if args.full else [("Avg", 0)]
        columns += [(f"{name} Latency(us){label}", 26, lambda stats, _i, _f, impl=impl, k=k: f"{stats[impl][k]:.2f}")
                    for name, k in shown]
    if args.full:
        columns.append(("Iterations", 12, lambda _s, iterations, _f: f"{iterations:d}"))
    if len(impls) == 2:
        columns.append((f"Ratio({baseline}/scaffe)", 22,
                        lambda stats, _i, _f: f"{stats[baseline][0] / stats['scaffe'][0]:.2f}"))
    if args.floor:
        columns.append(("Floor(us)", 12, lambda _s, _i, floor: f"{floor:.2f}"))
    return columns


def waited(args, blocking, nonblocking):
    """The call a case times: `blocking`, or with --nonblocking `nonblocking`'s request waited for."""
    if args.nonblocking:
        return lambda: nonblocking().Wait()
    return blocking


def run(title, make_case, argv=None):
    """Run one benchmark. make_case(comm, count, dtype, impl, args) -> (call, check) for one size.

    `comm` is the plain MPI communicator for impl "native" and a collectives.Comm for "scaffe".
    `check()` (collective) clears what the call writes, makes one more call and raises AssertionError
    when its result is wrong: the implementations share their buffers (see `buffers`).
    """
    args = parse_args(title, argv)
    if args.nonblocking:
        title = "I" + title.lower()
    world = MPI.COMM_WORLD
    fast = collectives.Comm(world)
    topology = fast.describe()  # collective: every rank sets up before rank 0 prints
    rank = world.Get_rank()
    dtype, mpi_name = DTYPES[args.type]
    dtype = numpy.dtype(dtype)
    baseline = "staged" if args.device in DEVICES else "native"
    impls = [baseline, "scaffe"] if args.impl == "both" else [args.impl]
    comms = {"native": world, "scaffe": fast}
    if "staged" in impls:
        comms["staged"] = staged_comm(world)
    columns = output_columns(args, impls, baseline)
    rows = []
    if rank == 0:
        print(f"# OSU MPI{'-CUDA' if args.device in DEVICES else ''} {title} Latency Test (scaffe perf)")
        print(f"# {world.Get_size()} ranks; topology: {topology}; datatype: {mpi_name}")
        print("# Size" + "".join(f"{title:>{width}}" for title, width, _ in columns), flush=True)
    for size in sizes(args, dtype.itemsize):
        count = size // dtype.itemsize
        iters, warm = iterations_for(args, size)
        cases = {impl: make_case(comms[impl], count, dtype, impl, args) for impl in impls}
        totals = {impl: 0.0 for impl in impls}
        rounds = ROUNDS if len(impls) == 2 else 1
        for round_index in range(rounds):
            for impl in (impls if round_index % 2 == 0 else impls[::-1]):
                call, check = cases[impl]
                totals[impl] += time_calls(world, call, max(1, iters // rounds), warm)
                if args.validation:
                    check()
        stats = {impl: across_ranks(world, totals[impl] / rounds) for impl in impls}
        floor = bandwidth_floor(count, dtype, world.Get_size()) * 1e6 if args.floor else None
        if rank == 0:
            print(f"{size:<10d}" + "".join(f"{value(stats, iters, floor):>{width}}" for _, width, value in columns),
                  flush=True)
            rows.append((size, {impl: stats[impl][0] for impl in impls}, floor))
    if rank == 0 and args.plot:
        plot(rows, impls, title, args.plot)


def plot(rows, impls, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r[0] for r in rows]
    for impl in impls:
        ax.plot(x, [r[1][impl] for r in rows], marker="o", label=impl)
    if rows and rows[0][2] is not None:
        ax.plot(x, [r[2] for r in rows], linestyle="--", label="numpy floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("latency (us)")
    ax.set_title(f"{title}: {MPI.COMM_WORLD.Get_size()} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    sys.stdout.write(f"# plot written to {path}\n")


def buffers(comm, count, dtype, impl, args, value):
    """A send buffer filled with `value` and a receive buffer: in shared memory for scaffe with --alloc,
    else one pair that both implementations use in turn (on the GPU with -d cuda)."""
    if impl == "scaffe" and args.alloc:
        send = comm.alloc((count,), dtype)
        recv = comm.alloc((count,), dtype)
        send[:] = value
        recv[:] = 0
        return send, recv
    return _plain_buffers(count, numpy.dtype(dtype).str, value, args.device)


# One pair for both implementations, because where a buffer's pages land decides a large part of its
# speed (perf/RESULTS.md, "Benchmark buffers").
@functools.lru_cache(maxsize=1)
def _plain_buffers(count, dtype, value, device):
    if device == "cuda":
        from kernels.numba_cuda import cuda
        return (cuda.to_device(numpy.full(count, value, dtype=dtype)),
                cuda.to_device(numpy.zeros(count, dtype=dtype)))
    if device == "cupy":
        import cupy
        return cupy.full(count, value, dtype=dtype), cupy.zeros(count, dtype=dtype)
    return numpy.full(count, value, dtype=dtype), numpy.zeros(count, dtype=dtype)


def case(call, result, expected, description, clear_result=True, check_result=True):
    """(call, check) for `run`: check() zeroes `result` (if clear_result), makes one more call, and, if
    check_result, raises AssertionError unless every element of `result` equals `expected`."""
    def check():
        if clear_result:
            clear(result)
        call()
        if check_result:
            got = on_host(result)
            if got.size and not numpy.all(got == expected):
                raise AssertionError(f"{description}: got {got[:4]}..., expected {expected}")

    return call, check


def clear(buf):
    """Zero a benchmark buffer, wherever it lives (a check's call must write every element it checks)."""
    if isinstance(buf, numpy.ndarray) or get_array_module(buf) is not numpy:
        buf.fill(0)
    else:
        buf.copy_to_device(numpy.zeros(buf.shape, buf.dtype))
