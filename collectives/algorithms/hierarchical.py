"""Two levels: shared memory inside each node first, then a pipelined tree or chain among one head per node.

The head of the root's node is the root itself, so the final result is written straight into the
root's receive buffer and never hops through another local rank.
"""
from collectives.algorithms import chain, pipeline, tree

# Among node heads, a chain moves n bytes per link but has P-1 hops of latency; a binomial tree has
# log2(P) hops but its inner ranks receive from several children. Chains win once chunks pipeline.
CHAIN_FROM_BYTES = 4 << 20


def _shape(nbytes):
    return chain.shape if nbytes >= CHAIN_FROM_BYTES else tree.shape


def reduce(comm, call):
    topo, shm = comm.node_topology, comm.shm
    root = call.root
    if topo.num_nodes == 1:
        shm.reduce(call.send, call.op_name, target=topo.local_rank_of[root],
                   dst=call.recv if topo.rank == root else None, chunk_bytes=comm.shm_chunk_bytes)
        shm.finish()
        return
    heads = topo.heads_comm(root)  # collective on first use: every rank calls it
    target = topo.local_rank_of[root] if topo.node == topo.node_of[root] else 0
    node_result = shm.reduce(call.send, call.op_name, target=target, chunk_bytes=comm.shm_chunk_bytes)
    if heads is not None:
        parent, children = _shape(call.send.nbytes)(heads.Get_rank(), heads.Get_size(), topo.node_of[root])
        pipeline.reduce(heads, node_result, call.recv if parent is None else None, call.op_name,
                        parent, children, comm.chunk_elements(call.send.dtype), comm.scratch)
    shm.finish()


def allreduce(comm, call):
    topo, shm = comm.node_topology, comm.shm
    if topo.num_nodes == 1:
        shm.allreduce(call.send, call.recv, call.op_name, chunk_bytes=comm.shm_chunk_bytes)
        return
    leaders = topo.leaders_comm
    shape = _shape(call.send.nbytes)
    chunk = comm.chunk_elements(call.send.dtype)

    def between_nodes(node_result):
        parent, children = shape(leaders.Get_rank(), leaders.Get_size(), 0)
        pipeline.reduce(leaders, node_result, node_result, call.op_name, parent, children, chunk, comm.scratch)
        pipeline.bcast(leaders, node_result, parent, children, chunk)

    shm.allreduce(call.send, call.recv, call.op_name, chunk_bytes=comm.shm_chunk_bytes,
                  between_nodes=between_nodes, head=0)


def bcast(comm, call):
    topo, shm = comm.node_topology, comm.shm
    root = call.root
    if topo.num_nodes == 1:
        shm.bcast(call.recv, topo.local_rank_of[root], chunk_bytes=comm.chunk_bytes)
        return
    heads = topo.heads_comm(root)
    source = topo.local_rank_of[root] if topo.node == topo.node_of[root] else 0
    produce = None
    if heads is not None:
        parent, children = _shape(call.recv.nbytes)(heads.Get_rank(), heads.Get_size(), topo.node_of[root])

        def produce(chunk, chunk_arrived):
            pipeline.bcast(heads, call.recv, parent, children, chunk, on_chunk=chunk_arrived)

    shm.bcast(call.recv, source, chunk_bytes=comm.chunk_bytes, produce=produce)
