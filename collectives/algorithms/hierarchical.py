"""Two levels: shared memory inside each node first, then a pipelined tree or chain among one head per node.

The head of the root's node is the root itself, so the final result is written straight into the
root's receive buffer and never hops through another local rank.
"""
import numpy
from mpi4py import MPI

from collectives import waiting
from collectives.algorithms import chain, pipeline, tree
from collectives.ops import native_reduces

# Chunks of an eighth of the call let a chain fill; no smaller than this, so that each chunk's own costs
# (a message, a pass of the loop) stay small beside its time on the link.
CHUNKS_PER_CALL = 8
MIN_CHUNK_BYTES = 256 << 10


def heads_shape(nbytes, heads, largest_chunk):
    """(tree.shape or chain.shape, chunk in bytes) of an nbytes call among `heads` node heads.

    A binomial tree's root takes ceil(log2 P) children's streams on its one link; along a chain every link
    carries the call once, but it fills over P - 2 more chunks. With k chunks the chain takes about k + P - 2
    chunk-times against the tree's ceil(log2 P) x k (perf/RESULTS.md, "A chain among node heads"). The
    choice rests on the call's size, the heads' count and SCAFFE_CHUNK_BYTES alone, so every head makes it.
    """
    chunk_bytes = min(largest_chunk, max(MIN_CHUNK_BYTES, nbytes // CHUNKS_PER_CALL))
    chunks = max(1, -(-nbytes // chunk_bytes))
    chain_fills_faster = chunks + heads - 2 < (heads - 1).bit_length() * chunks
    return (chain.shape if chain_fills_faster else tree.shape), chunk_bytes


def heads_pipeline(comm, heads, nbytes, dtype, root, turns):
    """(routes, chunk in elements) of this rank in the pipeline among the node heads `heads`: chunk c goes along
    routes[c % len(routes)] (collectives.algorithms.pipeline). With `turns` (Comm.two_way, on the host) the
    chunks of a chain take chain.turns in equal numbers, so that a reduce and a broadcast at once load every
    non-root head's link alike (perf/RESULTS.md, "Chains in turn"); else one chain."""
    size, rank = heads.Get_size(), heads.Get_rank()
    shape, chunk_bytes = heads_shape(nbytes, size, comm.chunk_bytes)
    itemsize = numpy.dtype(dtype).itemsize
    chunk = max(1, chunk_bytes // itemsize)
    if shape is tree.shape or not turns:
        return [shape(rank, size, root)], chunk
    routes = chain.turns(rank, size, root)
    count = nbytes // itemsize
    per_turn = -(-max(1, -(-count // chunk)) // len(routes))  # the call's chunks, as many along each turn
    return routes, max(1, -(-count // (per_turn * len(routes))))


def reduce(comm, call):
    topo, shm = comm.node_topology, comm.shm
    root = call.root
    local_root = topo.local_rank_of[root]
    if topo.num_nodes == 1:
        shm.reduce(call.send, call.recv, call.op_name, target=local_root)
        return
    heads = topo.heads_comm(root)  # collective on first use: every rank calls it
    target = local_root if topo.node == topo.node_of[root] else 0
    node_result = None
    if heads is not None:
        node_result = call.recv if topo.rank == root else comm.scratch.get("node", call.nbytes, call.send.dtype)
    shm.reduce(call.send, node_result, call.op_name, target=target)
    if heads is not None:
        routes, chunk = heads_pipeline(comm, heads, call.nbytes, call.send.dtype, topo.node_of[root], comm.two_way)
        pipeline.reduce(heads, node_result, node_result, call.op_name, routes, chunk, comm.scratch)


def allreduce(comm, call):
    """When all nodes have the same size, every rank carries a share of the inter-node traffic: each
    local rank's piece of the node's sum is allreduced with the owners of that piece on the other nodes
    before the node reads it. Otherwise a node reduce to local rank 0, an allreduce among leaders (reduce
    then broadcast down the same tree) and the MPI library's broadcast inside each node, which makes one
    copy where our cells make two (perf/RESULTS.md, "Across nodes")."""
    topo, shm = comm.node_topology, comm.shm
    if topo.num_nodes == 1:
        shm.allreduce(call.send, call.recv, call.op_name)
        return
    if topo.column_comm is not None and native_reduces(call.recv.dtype):
        # In three steps, since MPI cannot be called from the compiled node loop: each rank's range of the
        # node's sum, then one allreduce of that range with its owners on the other nodes, then the node
        # reads every range; faster than a pass that allreduces each chunk as it is reduced
        # (perf/RESULTS.md, "Across nodes").
        shm.reduce_scatter(call.send, call.recv, call.op_name)
        lo, hi = shm.owned_range(call.recv.shape[0], call.recv.dtype)
        waiting.complete(MPI.Intracomm.Allreduce, MPI.Intracomm.Iallreduce, topo.column_comm, MPI.IN_PLACE,
                         call.recv[lo:hi], call.op)
        shm.allgather(call.recv)
        return
    shm.reduce(call.send, call.recv, call.op_name, target=0)
    leaders = topo.leaders_comm
    if leaders is not None:
        routes, chunk = heads_pipeline(comm, leaders, call.nbytes, call.recv.dtype, 0, comm.two_way)
        pipeline.reduce(leaders, call.recv, call.recv, call.op_name, routes, chunk, comm.scratch)
        pipeline.bcast(leaders, call.recv, routes, chunk)
    topo.node_comm.Bcast(call.recv, root=0)


def bcast(comm, call):
    topo, shm = comm.node_topology, comm.shm
    root = call.root
    if topo.num_nodes == 1:
        shm.bcast(call.recv, topo.local_rank_of[root])
        return
    heads = topo.heads_comm(root)
    source = topo.local_rank_of[root] if topo.node == topo.node_of[root] else 0
    produce = None
    if heads is not None:
        routes, chunk = heads_pipeline(comm, heads, call.nbytes, call.recv.dtype, topo.node_of[root],
                                       comm.two_way)

        def produce(arrived):
            pipeline.bcast(heads, call.recv, routes, chunk, on_chunk=lambda done: arrived(done * chunk))

    shm.bcast(call.recv, source, produce=produce)
