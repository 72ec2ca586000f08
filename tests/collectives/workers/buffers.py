"""Buffer arguments beyond plain numpy arrays, node-shared (`alloc`) buffers, and what falls back to MPI.

Every result is compared exactly with numpy; fallbacks (user-defined ops, derived datatypes, bool) are
also compared with what the wrapped MPI.COMM_WORLD itself gives for the same call.

    mpiexec -n 3 python buffers.py [--settings VAR=value,...]...

Each --settings runs every check once more on a communicator made under them (worker_util.each_setting).
"""
import array
import weakref

import numpy
from mpi4py import MPI

from worker_util import OPS, check_each_setting, contribution, expected_reduction

# Above every entry of the selection table for 4-byte elements (Reduce 256 KiB, Allreduce 1 MiB),
# and not a multiple of any chunk, so the default selection leaves native MPI too.
N = 270001


def inputs(w, op, dtype, n, seed):
    return [contribution(op, dtype, n, r, seed) for r in range(w.size)]


def sentinel_like(a):
    return numpy.full_like(a, 99)


def check_specs(w):
    comm, rank, size = w.comm, w.rank, w.size
    last = size - 1

    w.case("Allreduce [buf, MPI.FLOAT]")
    data = inputs(w, "sum", numpy.float32, N, 1)
    recv = sentinel_like(data[rank])
    comm.Allreduce([data[rank], MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
    w.check(recv, expected_reduction("sum", data), "result")

    w.case("Reduce [buf, MPI.FLOAT] at the last rank")
    recv = sentinel_like(data[rank])
    comm.Reduce([data[rank], MPI.FLOAT], [recv, MPI.FLOAT] if rank == last else None, op=MPI.MAX, root=last)
    if rank == last:
        w.check(recv, expected_reduction("max", data), "result")

    w.case("Allreduce [MPI.IN_PLACE] with [buf, MPI.FLOAT]")
    recv = data[rank].copy()
    comm.Allreduce(MPI.IN_PLACE, [recv, MPI.FLOAT], op=MPI.SUM)
    w.check(recv, expected_reduction("sum", data), "result")

    w.case("Bcast [buf, MPI.FLOAT] from the last rank")
    buf = data[rank].copy() if rank == last else sentinel_like(data[rank])
    comm.Bcast([buf, MPI.FLOAT], root=last)
    w.check(buf, data[last], "result")

    w.case("Allreduce [buf, count, MPI.DOUBLE]: only the first count elements")
    count = N - 5
    data = inputs(w, "sum", numpy.float64, N, 2)
    recv = sentinel_like(data[rank])
    comm.Allreduce([data[rank], count, MPI.DOUBLE], [recv, count, MPI.DOUBLE], op=MPI.SUM)
    w.check(recv[:count], expected_reduction("sum", [d[:count] for d in data]), "counted part")
    w.check(recv[count:], sentinel_like(data[rank])[count:], "elements past count")

    w.case("Iallreduce [buf, count, MPI.DOUBLE] + Wait")
    recv = sentinel_like(data[rank])
    comm.Iallreduce([data[rank], count, MPI.DOUBLE], [recv, count, MPI.DOUBLE], op=MPI.MIN).Wait()
    w.check(recv[:count], expected_reduction("min", [d[:count] for d in data]), "counted part")
    w.check(recv[count:], sentinel_like(data[rank])[count:], "elements past count")

    w.case("Reduce/Allreduce/Bcast [buf, (count, displ), MPI.INT]")
    count, displ = N - 20, 7
    data = inputs(w, "sum", numpy.intc, N, 3)
    window = slice(displ, displ + count)
    recv = sentinel_like(data[rank])
    comm.Reduce([data[rank], (count, displ), MPI.INT], [recv, (count, displ), MPI.INT], op=MPI.SUM, root=0)
    if rank == 0:
        w.check(recv[window], expected_reduction("sum", [d[window] for d in data]), "window")
        w.check(numpy.concatenate([recv[:displ], recv[displ + count:]]),
                numpy.full(N - count, 99, dtype=numpy.intc), "outside the window")
    recv = sentinel_like(data[rank])
    comm.Allreduce([data[rank], (count, displ), MPI.INT], [recv, (count, displ), MPI.INT], op=MPI.MAX)
    w.check(recv[window], expected_reduction("max", [d[window] for d in data]), "window")
    w.check(recv[:displ], numpy.full(displ, 99, dtype=numpy.intc), "before the window")
    buf = data[rank].copy() if rank == 0 else sentinel_like(data[rank])
    comm.Bcast([buf, (count, displ), MPI.INT], root=0)
    w.check(buf[window], data[0][window], "window")
    if rank != 0:
        w.check(buf[displ + count:], numpy.full(N - count - displ, 99, dtype=numpy.intc), "after the window")

    w.case("bytearray: Allreduce BXOR, Bcast, and [bytearray, MPI.INT]")
    data = inputs(w, "bxor", numpy.uint8, N, 4)
    send, recv = bytearray(data[rank].tobytes()), bytearray(N)
    comm.Allreduce(send, recv, op=MPI.BXOR)
    w.check(numpy.frombuffer(recv, numpy.uint8), expected_reduction("bxor", data), "result")
    w.check(numpy.frombuffer(send, numpy.uint8), data[rank], "send buffer")
    buf = bytearray(data[0].tobytes()) if rank == 0 else bytearray(N)
    comm.Bcast(buf, root=0)
    w.check(numpy.frombuffer(buf, numpy.uint8), data[0], "bcast result")
    ints = inputs(w, "sum", numpy.intc, N // 4, 5)
    recv = bytearray(ints[0].nbytes)
    comm.Allreduce([bytearray(ints[rank].tobytes()), MPI.INT], [recv, MPI.INT], op=MPI.SUM)
    w.check(numpy.frombuffer(recv, numpy.intc), expected_reduction("sum", ints), "result as int")

    w.case("array.array 'd', 'i', 'b' as send and receive buffers")
    for code, dtype in (("d", numpy.float64), ("i", numpy.intc), ("b", numpy.int8)):
        data = inputs(w, "sum", dtype, N, 6)
        send = array.array(code, data[rank].tobytes())
        recv = array.array(code, bytes(data[rank].nbytes))
        comm.Allreduce(send, recv, op=MPI.SUM)
        w.check(numpy.frombuffer(recv, dtype), expected_reduction("sum", data), f"Allreduce {code!r}")
        recv = array.array(code, bytes(data[rank].nbytes))
        comm.Reduce(send, recv if rank == last else None, op=MPI.SUM, root=last)
        if rank == last:
            w.check(numpy.frombuffer(recv, dtype), expected_reduction("sum", data), f"Reduce {code!r}")

    w.case("mixed specs across ranks: numpy, [buf, MPI.FLOAT], array.array('f'), [buf, count, MPI.FLOAT]")
    data = inputs(w, "sum", numpy.float32, N, 7)
    recv = sentinel_like(data[rank])
    style = rank % 4
    if style == 0:
        send, recv_arg = data[rank], recv
    elif style == 1:
        send, recv_arg = [data[rank], MPI.FLOAT], [recv, MPI.FLOAT]
    elif style == 2:
        send, recv_arg = array.array("f", data[rank].tobytes()), recv
    else:
        send, recv_arg = [data[rank], N, MPI.FLOAT], [recv, N, MPI.FLOAT]
    comm.Allreduce(send, recv_arg, op=MPI.SUM)
    w.check(recv, expected_reduction("sum", data), "result")

    w.case("2-D C- and Fortran-ordered arrays")
    rows, cols = 301, 233
    for order in "CF":
        data = [numpy.asarray(d.reshape(rows, cols), order=order)
                for d in inputs(w, "sum", numpy.float64, rows * cols, 8)]
        recv = numpy.zeros((rows, cols), order=order)
        comm.Allreduce(data[rank], recv, op=MPI.SUM)
        w.check(recv.ravel(), expected_reduction("sum", data).ravel(), f"order {order}")


def check_alloc(w):
    comm, rank, size = w.comm, w.rank, w.size
    last = size - 1
    n = 20011  # 160 KB of float64: past the selection threshold, and many chunks
    shared_send = comm.alloc((n,), numpy.float64)
    shared_recv = comm.alloc((n,), numpy.float64)
    w.check_true(isinstance(shared_send, numpy.ndarray) and shared_send.shape == (n,)
                 and shared_send.dtype == numpy.float64, f"alloc gave {shared_send!r:.80}")
    plain_recv = numpy.empty(n)

    # who uses a shared buffer: everyone, nobody, even ranks only, odd ranks only
    layouts = {"all": lambda r: True, "none": lambda r: False,
               "even": lambda r: r % 2 == 0, "odd": lambda r: r % 2 == 1}
    seed = 100
    for layout, shared in layouts.items():
        for root in sorted({0, last}):
            for recv_shared in (True, False):
                for repeat in range(2):  # reusing the same buffers with new data
                    seed += 1
                    w.case(f"alloc Reduce layout={layout} root={root} recv_shared={recv_shared} repeat={repeat}")
                    data = inputs(w, "sum", numpy.float64, n, seed)
                    send = shared_send if shared(rank) else numpy.empty(n)
                    send[:] = data[rank]
                    recv = shared_recv if recv_shared else plain_recv
                    recv[:] = -1
                    comm.Reduce(send, recv if rank == root else None, op=MPI.SUM, root=root)
                    if rank == root:
                        w.check(recv, expected_reduction("sum", data), "result")
                    w.check(send, data[rank], "send buffer")

                    w.case(f"alloc Allreduce layout={layout} recv_shared={recv_shared} repeat={repeat}")
                    recv[:] = -1
                    comm.Allreduce(send, recv, op=MPI.MAX)
                    w.check(recv, expected_reduction("max", data), "result")
                    w.check(send, data[rank], "send buffer")

                    w.case(f"alloc Iallreduce IN_PLACE layout={layout} recv_shared={recv_shared} repeat={repeat}")
                    target = shared_recv if shared(rank) else plain_recv
                    target[:] = data[rank]
                    comm.Iallreduce(MPI.IN_PLACE, target, op=MPI.SUM).Wait()
                    w.check(target, expected_reduction("sum", data), "result")

                    w.case(f"alloc Reduce IN_PLACE at root={root} layout={layout} repeat={repeat}")
                    if rank == root:
                        target = shared_recv if shared(rank) else plain_recv
                        target[:] = data[rank]
                        comm.Reduce(MPI.IN_PLACE, target, op=MPI.SUM, root=root)
                        w.check(target, expected_reduction("sum", data), "result")
                    else:
                        send = shared_send if shared(rank) else numpy.empty(n)
                        send[:] = data[rank]
                        comm.Reduce(send, None, op=MPI.SUM, root=root)
                        w.check(send, data[rank], "send buffer")

    w.case("alloc: a slice at an offset inside the shared window, int32 MAX, 2-D shape")
    block = comm.alloc((7, 10007), numpy.int32)
    data = inputs(w, "max", numpy.int32, 5 * 10007 - 3, 200)
    view = block.reshape(-1)[3:3 + data[0].size]
    view[:] = data[rank]
    allreduce_then_reduce(w, view, data, "max", "min")

    w.case("alloc: Bcast into and out of shared buffers")
    buf = comm.alloc((n,), numpy.float32)
    data = inputs(w, "sum", numpy.float32, n, 201)
    buf[:] = data[last] if rank == last else 0
    comm.Bcast(buf, root=last)
    w.check(buf, data[last], "result")

    w.case("alloc: several nonblocking calls in flight on shared buffers, then Waitall")
    sends = [comm.alloc((n,), numpy.float64) for _ in range(3)]
    recvs = [comm.alloc((n,), numpy.float64) for _ in range(3)]
    data = [inputs(w, "sum", numpy.float64, n, 300 + k) for k in range(3)]
    for k in range(3):
        sends[k][:] = data[k][rank]
    requests = [comm.Iallreduce(sends[0], recvs[0], op=MPI.SUM),
                comm.Ireduce(sends[1], recvs[1], op=MPI.SUM, root=last),
                comm.Iallreduce(sends[2], recvs[2], op=MPI.MIN)]
    MPI.Request.Waitall(requests)
    w.check(recvs[0], expected_reduction("sum", data[0]), "first result")
    if rank == last:
        w.check(recvs[1], expected_reduction("sum", data[1]), "second result")
    w.check(recvs[2], expected_reduction("min", data[2]), "third result")


def check_alloc_interpreted(w):
    """BXOR runs on the interpreted node loop, which must read shared send buffers in place as the compiled
    one does: everyone's, nobody's, even ranks' only."""
    comm, rank = w.comm, w.rank
    n = 20011
    shared_ints = comm.alloc((n,), numpy.int64)
    for layout, shared in (("all", True), ("none", False), ("even", rank % 2 == 0)):
        w.case(f"alloc Allreduce and Reduce BXOR int64 layout={layout}")
        data = inputs(w, "bxor", numpy.int64, n, 400)
        send = shared_ints if shared else numpy.empty(n, numpy.int64)
        send[:] = data[rank]
        allreduce_then_reduce(w, send, data, "bxor", "bxor")


def allreduce_then_reduce(w, send, data, allreduce_op, reduce_op):
    """An Allreduce and then a Reduce to the last rank of `send` (holding data[rank]), checked with numpy."""
    last = w.size - 1
    out = numpy.empty_like(data[0])
    w.comm.Allreduce(send, out, op=OPS[allreduce_op])
    w.check(out, expected_reduction(allreduce_op, data), "Allreduce")
    w.comm.Reduce(send, out if w.rank == last else None, op=OPS[reduce_op], root=last)
    if w.rank == last:
        w.check(out, expected_reduction(reduce_op, data), "Reduce")
    w.check(send, data[w.rank], "send buffer")


def check_fallbacks(w):
    data = inputs(w, "sum", numpy.float64, N, 400)
    user_sum = MPI.Op.Create(_add_into, commute=True)
    check_user_op(w, data, user_sum)
    check_derived_datatypes(w, data, user_sum)
    user_sum.Free()
    check_bool_ops(w)
    check_maxloc(w)


def _add_into(inbuf, inoutbuf, datatype):
    a = numpy.frombuffer(inbuf, dtype=numpy.float64)
    b = numpy.frombuffer(inoutbuf, dtype=numpy.float64)
    b += a


def check_user_op(w, data, user_sum):
    comm, world, rank, size = w.comm, MPI.COMM_WORLD, w.rank, w.size
    expected = expected_reduction("sum", data)
    w.case("user-defined op: Allreduce, Reduce, Iallreduce, Ireduce")
    ours, theirs = numpy.empty(N), numpy.empty(N)
    comm.Allreduce(data[rank], ours, op=user_sum)
    world.Allreduce(data[rank], theirs, op=user_sum)
    w.check(ours, expected, "Allreduce")
    w.check(ours, theirs, "Allreduce vs the wrapped MPI")
    ours[:] = 0
    comm.Iallreduce(data[rank], ours, op=user_sum).Wait()
    w.check(ours, expected, "Iallreduce")
    for root in sorted({0, size - 1}):
        ours[:] = 0
        comm.Reduce(data[rank], ours, op=user_sum, root=root)
        if rank == root:
            w.check(ours, expected, "Reduce")
        ours[:] = 0
        comm.Ireduce(data[rank], ours, op=user_sum, root=root).Wait()
        if rank == root:
            w.check(ours, expected, "Ireduce")


def check_derived_datatypes(w, data, user_sum):
    comm, world, rank, size = w.comm, MPI.COMM_WORLD, w.rank, w.size
    expected = expected_reduction("sum", data)
    # MPI defines its predefined ops on predefined datatypes only, so derived types reduce with user ops.
    w.case("derived datatype (contiguous pairs of doubles) with a user-defined op")
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    m = N - 1  # even
    ours, theirs = numpy.zeros(m), numpy.zeros(m)
    comm.Allreduce([data[rank][:m], m // 2, pair], [ours, m // 2, pair], op=user_sum)
    world.Allreduce([data[rank][:m], m // 2, pair], [theirs, m // 2, pair], op=user_sum)
    w.check(ours, expected[:m], "Allreduce")
    w.check(ours, theirs, "vs the wrapped MPI")
    ours[:] = 0
    comm.Reduce([data[rank][:m], m // 2, pair], [ours, m // 2, pair], op=user_sum, root=size - 1)
    if rank == size - 1:
        w.check(ours, expected[:m], "Reduce")
    buf = data[rank][:m].copy() if rank == 0 else numpy.zeros(m)
    comm.Bcast([buf, m // 2, pair], root=0)
    w.check(buf, data[0][:m], "Bcast")
    pair.Free()

    w.case("derived datatype (every other double, a vector type): Bcast leaves the others untouched")
    every_other = MPI.DOUBLE.Create_vector(m // 2, 1, 2).Commit()
    for nonblocking in (False, True):
        buf = data[rank][:m].copy() if rank == 0 else numpy.full(m, 99.0)
        if nonblocking:
            comm.Ibcast([buf, 1, every_other], root=0).Wait()
        else:
            comm.Bcast([buf, 1, every_other], root=0)
        w.check(buf[0::2], data[0][:m:2], "strided elements")
        if rank != 0:
            w.check(buf[1::2], numpy.full(m // 2, 99.0), "elements between")
    every_other.Free()


def check_bool_ops(w):
    comm, world, rank, size = w.comm, MPI.COMM_WORLD, w.rank, w.size
    w.case("bool arrays (MPI.C_BOOL) with LOR and LAND go to MPI")
    flags = [contribution("land", numpy.int8, N, r, 401) != 0 for r in range(size)]
    for name, op, fold in (("lor", MPI.LOR, numpy.logical_or), ("land", MPI.LAND, numpy.logical_and)):
        ours, theirs = numpy.zeros(N, bool), numpy.zeros(N, bool)
        comm.Allreduce(flags[rank], ours, op=op)
        world.Allreduce(flags[rank], theirs, op=op)
        w.check(ours, fold.reduce(numpy.array(flags), axis=0), name)
        w.check(ours, theirs, f"{name} vs the wrapped MPI")


def check_maxloc(w):
    comm, world, rank, size = w.comm, MPI.COMM_WORLD, w.rank, w.size
    w.case("MAXLOC over (double, int) pairs goes to MPI")
    pair_dtype = numpy.dtype([("value", numpy.float64), ("index", numpy.intc)], align=True)
    if pair_dtype.itemsize != MPI.DOUBLE_INT.Get_extent()[1]:
        return
    values = numpy.zeros(64, dtype=pair_dtype)
    values["value"] = contribution("max", numpy.float64, 64, rank, 402)
    values["index"] = rank
    ours, theirs = numpy.zeros_like(values), numpy.zeros_like(values)
    comm.Allreduce([values, MPI.DOUBLE_INT], [ours, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    world.Allreduce([values, MPI.DOUBLE_INT], [theirs, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    everyone = numpy.array([contribution("max", numpy.float64, 64, r, 402) for r in range(size)])
    w.check(ours["value"], everyone.max(axis=0), "maximum values")
    w.check(ours["index"], everyone.argmax(axis=0).astype(numpy.intc), "lowest rank holding the maximum")
    for field in ("value", "index"):  # not the padding bytes, which nobody writes
        w.check(ours[field], theirs[field], f"{field} vs the wrapped MPI")


def check_repeats(w):
    """The same arrays in call after call, changed in place in between: what was remembered of them
    (the kept plan, `collectives.plans`) must not outlive the change, and every rank must still pick the same algorithm."""
    n = 10
    send, recv, buf = numpy.empty(n, numpy.float32), numpy.empty(n, numpy.float32), numpy.empty(n, numpy.float32)
    check_repeated_small_calls(w, send, recv, buf)
    check_repeated_large_calls(w)
    check_no_buffer_kept(w, (n, N))
    check_resized_in_place(w, send, recv, (N, n))


def check_repeated_small_calls(w, send, recv, buf):
    comm, rank = w.comm, w.rank
    for step, dtype in enumerate((numpy.float32, numpy.float32, numpy.float16, numpy.float16)):
        if dtype != send.dtype:  # float16, which MPI lacks, reinterpreting the same memory
            send.dtype = recv.dtype = buf.dtype = dtype
        w.case(f"repeated small Reduce, Allreduce, Bcast on the same arrays: {numpy.dtype(dtype)}, call {step}")
        data = inputs(w, "sum", dtype, send.shape[0], 500 + step)
        send[:] = data[rank]
        recv[:] = 99
        comm.Allreduce(send, recv)
        w.check(recv, expected_reduction("sum", data), "Allreduce")
        recv[:] = 99
        comm.Reduce(send, recv, op=MPI.MAX, root=0)
        if rank == 0:
            w.check(recv, expected_reduction("max", data), "Reduce")
        buf[:] = data[rank]
        comm.Bcast(buf, root=0)
        w.check(buf, data[0], "Bcast")


def check_repeated_large_calls(w):
    comm, rank = w.comm, w.rank
    w.case("repeated large Allreduce and Reduce on the same arrays, new data each time")
    big_send, big_recv = numpy.empty(N, numpy.float32), numpy.empty(N, numpy.float32)
    for step in range(3):
        data = inputs(w, "sum", numpy.float32, N, 520 + step)
        big_send[:] = data[rank]
        big_recv[:] = 99
        comm.Allreduce(big_send, big_recv)
        w.check(big_recv, expected_reduction("sum", data), f"Allreduce {step}")
        big_recv[:] = 99
        comm.Reduce(big_send, big_recv, op=MPI.MIN, root=w.size - 1)
        if rank == w.size - 1:
            w.check(big_recv, expected_reduction("min", data), f"Reduce {step}")


def check_no_buffer_kept(w, sizes):
    for size in sizes:
        w.case(f"repeated calls keep no buffer alive ({size} elements)")
        kept = numpy.ones(size, numpy.float32), numpy.empty(size, numpy.float32)
        for _ in range(2):
            w.comm.Allreduce(*kept)
            w.comm.Reduce(*kept, root=0)
        refs = [weakref.ref(a) for a in kept]
        del kept
        w.check_true(all(ref() is None for ref in refs), "the buffers outlived the last reference to them")


def check_resized_in_place(w, send, recv, sizes):
    for size in sizes:
        # Odd ranks take fresh arrays, which nothing remembers: all ranks must still run the same algorithm.
        w.case(f"the same arrays resized in place to {size} elements (fresh ones on odd ranks)")
        if w.rank % 2:
            send, recv = numpy.empty(size, send.dtype), numpy.empty(size, send.dtype)
        else:
            for a in (send, recv):
                a.resize(size, refcheck=False)
        data = inputs(w, "sum", send.dtype, size, 510)
        send[:] = data[w.rank]
        w.comm.Allreduce(send, recv)
        w.check(recv, expected_reduction("sum", data), "Allreduce")


def main():
    check_each_setting(__doc__, "buffers", check_all)


def check_all(w):
    check_specs(w)
    check_alloc(w)
    check_alloc_interpreted(w)
    check_fallbacks(w)
    check_repeats(w)


if __name__ == "__main__":
    main()
