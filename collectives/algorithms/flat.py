"""Tree or chain over all ranks as if each were its own node: no shared memory, point-to-point only."""
from collectives.algorithms import pipeline


def _run_reduce(comm, shape, send, recv, op, root):
    private = comm.private
    parent, children = shape(private.Get_rank(), private.Get_size(), root)
    pipeline.reduce(private, send, recv if parent is None else None, op, [(parent, children)],
                    comm.chunk_elements(send.dtype), comm.scratch)


def make(shape):
    """The three collectives along one tree shape (tree.shape or chain.shape)."""

    def reduce(comm, call):
        _run_reduce(comm, shape, call.send, call.recv, call.op_name, call.root)

    def allreduce(comm, call):
        _run_reduce(comm, shape, call.send, call.recv, call.op_name, 0)
        bcast_from(comm, call.recv, 0)

    def bcast_from(comm, buf, root):
        private = comm.private
        pipeline.bcast(private, buf, [shape(private.Get_rank(), private.Get_size(), root)],
                       comm.chunk_elements(buf.dtype))

    def bcast(comm, call):
        bcast_from(comm, call.recv, call.root)

    return reduce, allreduce, bcast
