"""Device buffers across nodes: the node's stage through IPC (collectives.devices.ipc), then the leaders'
chunked pipeline (collectives.devices.pipeline), in the two levels of the hierarchical path.

Reduce: every node reduces to its head (the root on the root's node, else local rank 0), then the heads
reduce along a tree into the root. Allreduce: every node reduces to local rank 0, the leaders reduce and
broadcast back down the same tree, and every node broadcasts from local rank 0. Bcast: the heads first,
then every node from its head. The node stages record their marks on the caller's stream when the call is
made (as every device call does); the leaders' stage of a Bcast, which reads the caller's buffer before any
node stage, waits for a mark of its own.
"""
from collectives.algorithms import hierarchical
from collectives.devices import pipeline


def start(comm, call, stream):
    """Mark the caller's stream now and return the call's work, which runs in call order."""
    return {"reduce": _reduce, "allreduce": _allreduce, "bcast": _bcast}[call.kind](comm, call, stream)


def _scratch(comm, device):
    """The leaders' pipeline buffers on `device` (made on the ranks that lead a node in some call)."""
    scratch = comm.device_pipelines.get(device)
    if scratch is None:
        scratch = comm.device_pipelines[device] = pipeline.Scratch(device)
    return scratch


def _reduce(comm, call, stream):
    topo, ipc = comm.node_topology, comm.device_ipc
    root = call.root
    on_root_node = topo.node == topo.node_of[root]
    target = topo.local_rank_of[root] if on_root_node else 0
    node_result = scratch = None
    if topo.local_rank == target:
        scratch = _scratch(comm, call.device)
        node_result = call.recv if topo.rank == root else scratch.node_result(call.send.size, call.send.dtype)
    node_stage = ipc.local_call(call.device, "reduce", call.send, node_result, call.op_name, target).start(stream)

    def work():
        node_stage()
        heads = topo.heads_comm(root)  # collective on first use: every rank asks
        if heads is not None:
            [(parent, children)], chunk = hierarchical.heads_pipeline(comm, heads, call.nbytes, call.send.dtype,
                                                                      topo.node_of[root], turns=False)
            pipeline.reduce(heads, node_result, node_result, call.op_name, parent, children, chunk, scratch,
                            scratch.cuda_aware)

    return work


def _allreduce(comm, call, stream):
    topo, ipc = comm.node_topology, comm.device_ipc
    leader = topo.leaders_comm is not None
    node_reduce = ipc.local_call(call.device, "reduce", call.send, call.recv if leader else None, call.op_name,
                                 0).start(stream)
    node_bcast = ipc.local_call(call.device, "bcast", None, call.recv, None, 0).start(stream)

    def work():
        node_reduce()
        if leader:
            leaders, scratch = topo.leaders_comm, _scratch(comm, call.device)
            [(parent, children)], chunk = hierarchical.heads_pipeline(comm, leaders, call.nbytes, call.recv.dtype, 0,
                                                                      turns=False)
            pipeline.reduce(leaders, call.recv, call.recv, call.op_name, parent, children, chunk, scratch,
                            scratch.cuda_aware)
            pipeline.bcast(leaders, call.recv, parent, children, chunk, scratch, scratch.cuda_aware)
        node_bcast()

    return work


def _bcast(comm, call, stream):
    topo, ipc = comm.node_topology, comm.device_ipc
    root = call.root
    source = topo.local_rank_of[root] if topo.node == topo.node_of[root] else 0
    scratch = _scratch(comm, call.device) if topo.local_rank == source else None
    caller_done = scratch.mark(stream) if scratch is not None else None
    node_stage = ipc.local_call(call.device, "bcast", None, call.recv, None, source).start(stream)

    def work():
        heads = topo.heads_comm(root)
        if heads is not None:
            scratch.wait_for(caller_done)  # the root's data is written; the others' buffers are free
            [(parent, children)], chunk = hierarchical.heads_pipeline(comm, heads, call.nbytes, call.recv.dtype,
                                                                      topo.node_of[root], turns=False)
            pipeline.bcast(heads, call.recv, parent, children, chunk, scratch, scratch.cuda_aware)
        node_stage()

    return work
