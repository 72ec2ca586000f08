"""`collectives.Comm(MPI.COMM_WORLD)` still does everything MPI.COMM_WORLD does, and our collectives never
disturb the user's own messages.

    mpiexec -n 3 python dropin.py
"""
import numpy
from mpi4py import MPI

import collectives
from worker_util import Worker, contribution, expected_reduction

N = 270001  # large enough to leave native MPI under the default selection


def check_identity(w):
    comm, world = w.comm, MPI.COMM_WORLD
    w.case("identity: an Intracomm with the world's rank, size and group")
    w.check_true(isinstance(comm, MPI.Intracomm), f"{type(comm)} is not an MPI.Intracomm")
    w.check_true(comm.Get_rank() == world.Get_rank() and comm.rank == world.rank, "rank differs")
    w.check_true(comm.Get_size() == world.Get_size() and comm.size == world.size, "size differs")
    w.check_true(MPI.Comm.Compare(comm, world) == MPI.IDENT, "not the same communicator as the one wrapped")
    w.check_true(MPI.Group.Compare(comm.Get_group(), world.Get_group()) == MPI.IDENT, "group differs")
    w.check_true(not comm.Is_inter(), "Is_inter")


def check_point_to_point(w):
    comm, rank, size = w.comm, w.rank, w.size
    right, left = (rank + 1) % size, (rank - 1) % size
    w.case("send/recv (pickled) around a ring")
    received = comm.sendrecv({"from": rank, "payload": [rank] * 3}, dest=right, source=left)
    w.check_true(received == {"from": left, "payload": [left] * 3}, f"received {received!r}")
    w.case("Send/Recv, Isend/Irecv, Sendrecv of numpy arrays")
    out = numpy.arange(10, dtype=numpy.float64) + rank
    got = numpy.empty(10)
    if size > 1:
        request = comm.Isend(out, dest=right, tag=5)
        comm.Recv(got, source=left, tag=5)
        request.Wait()
        w.check(got, numpy.arange(10, dtype=numpy.float64) + left, "Recv")
        request = comm.Irecv(got, source=left, tag=6)
        comm.Send(out, dest=right, tag=6)
        request.Wait()
        w.check(got, numpy.arange(10, dtype=numpy.float64) + left, "Irecv")
    comm.Sendrecv(out, dest=right, recvbuf=got, source=left)
    w.check(got, numpy.arange(10, dtype=numpy.float64) + left, "Sendrecv")


def check_other_collectives(w):
    comm, rank, size = w.comm, w.rank, w.size
    w.case("lowercase (pickle) collectives")
    w.check_true(comm.allreduce(rank) == size * (size - 1) // 2, "allreduce")
    w.check_true(comm.allreduce(rank, op=MPI.MAX) == size - 1, "allreduce MAX")
    total = comm.reduce(rank + 1, root=size - 1)
    w.check_true(total == (size * (size + 1) // 2 if rank == size - 1 else None), f"reduce gave {total!r}")
    w.check_true(comm.bcast("hello" if rank == 0 else None, root=0) == "hello", "bcast")
    w.check_true(comm.allgather(rank) == list(range(size)), "allgather")
    w.check_true(comm.gather(rank, root=0) == (list(range(size)) if rank == 0 else None), "gather")
    w.check_true(comm.scatter(list(range(10, 10 + size)) if rank == 0 else None, root=0) == 10 + rank, "scatter")
    w.check_true(comm.alltoall([rank * 100 + k for k in range(size)]) == [k * 100 + rank for k in range(size)],
                 "alltoall")
    comm.barrier()
    w.case("buffer collectives we do not override")
    everyone = numpy.empty(size, dtype=numpy.intc)
    comm.Allgather(numpy.array([rank], dtype=numpy.intc), everyone)
    w.check(everyone, numpy.arange(size, dtype=numpy.intc), "Allgather")
    prefix = numpy.empty(1, dtype=numpy.intc)
    comm.Scan(numpy.array([rank + 1], dtype=numpy.intc), prefix, op=MPI.SUM)
    w.check(prefix, numpy.array([(rank + 1) * (rank + 2) // 2], dtype=numpy.intc), "Scan")
    block = numpy.empty(2, dtype=numpy.float64)
    comm.Reduce_scatter_block(numpy.ones(2 * size), block, op=MPI.SUM)
    w.check(block, numpy.full(2, float(size)), "Reduce_scatter_block")
    comm.Barrier()
    comm.Ibarrier().Wait()


def check_derived_communicators(w):
    comm, rank, size = w.comm, w.rank, w.size
    w.case("Split: the halves work, and reduce correctly with our Reduce/Allreduce")
    half = comm.Split(color=rank % 2, key=-rank)
    members = [r for r in range(size) if r % 2 == rank % 2]
    w.check_true(half.Get_size() == len(members), f"split size {half.Get_size()} != {len(members)}")
    w.check_true(half.Get_rank() == sorted(members, reverse=True).index(rank), "split rank (key=-rank)")
    w.check_true(half.allreduce(rank) == sum(members), "allreduce on the split")
    for sub in (half, collectives.Comm(half)):
        data = [contribution("sum", numpy.float32, N, r, 11) for r in members]
        mine = data[members.index(rank)]
        out = numpy.empty(N, dtype=numpy.float32)
        sub.Allreduce(mine, out, op=MPI.SUM)
        w.check(out, expected_reduction("sum", data), f"Allreduce on {type(sub).__name__} from Split")
        out[:] = 0
        sub.Reduce(mine, out, op=MPI.SUM, root=0)
        if sub.Get_rank() == 0:
            w.check(out, expected_reduction("sum", data), f"Reduce on {type(sub).__name__} from Split")
        buf = numpy.arange(N, dtype=numpy.float32) if sub.Get_rank() == 0 else numpy.zeros(N, numpy.float32)
        sub.Bcast(buf, root=0)
        w.check(buf, numpy.arange(N, dtype=numpy.float32), f"Bcast on {type(sub).__name__} from Split")
    half.Free()

    w.case("Dup gives a working communicator of our kind, which can be freed")
    dup = comm.Dup()
    w.check_true(isinstance(dup, collectives.Comm), f"Dup returned {type(dup).__name__}")
    w.check_true(MPI.Comm.Compare(dup, comm) == MPI.CONGRUENT, "Dup is not congruent")
    data = [contribution("sum", numpy.float64, N, r, 12) for r in range(size)]
    out = numpy.empty(N)
    dup.Allreduce(data[rank], out, op=MPI.SUM)
    w.check(out, expected_reduction("sum", data), "Allreduce on the Dup")
    dup.Free()

    w.case("Split_type(COMM_TYPE_SHARED) and Create_group")
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    w.check_true(shared.allreduce(1) == shared.Get_size(), "shared split")
    shared.Free()
    group = comm.Get_group().Incl([0])
    solo = comm.Create_group(group)
    if rank == 0:
        w.check_true(solo.Get_size() == 1, "Create_group size")
        solo.Free()
    else:
        w.check_true(solo == MPI.COMM_NULL, "Create_group gave a communicator to a non-member")
    group.Free()


def check_user_messages_untouched(w):
    comm, rank, size = w.comm, w.rank, w.size
    w.case("a pending wildcard Irecv of the user's is not matched by our collectives' messages")
    inbox = numpy.full(4, -1.0)
    pending = comm.Irecv(inbox, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    data = [contribution("sum", numpy.float64, N, r, 13) for r in range(size)]
    out = numpy.empty(N)
    for root in range(size):
        comm.Reduce(data[rank], out, op=MPI.SUM, root=root)
        comm.Bcast(out, root=root)
    comm.Allreduce(data[rank], out, op=MPI.SUM)
    comm.Iallreduce(MPI.IN_PLACE, out, op=MPI.SUM).Wait()
    w.check_true(not pending.Test(), "the user's wildcard receive matched a collective's message")
    comm.Barrier()  # nobody sends the real message before every rank has looked
    comm.Send(numpy.full(4, float(rank)), dest=(rank + 1) % size, tag=77)
    status = MPI.Status()
    pending.Wait(status)
    w.check_true(status.Get_tag() == 77 and status.Get_source() == (rank - 1) % size,
                 f"the receive got tag {status.Get_tag()} from {status.Get_source()}")
    w.check(inbox, numpy.full(4, float((rank - 1) % size)), "user message")
    w.check(out, expected_reduction("sum", data) * size, "collective results")


def main():
    w = Worker()
    check_identity(w)
    check_point_to_point(w)
    check_other_collectives(w)
    check_derived_communicators(w)
    check_user_messages_untouched(w)
    w.done("dropin")


if __name__ == "__main__":
    main()
