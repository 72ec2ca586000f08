"""Device buffers without host copies: which calls take the direct path, and the path itself.

A call takes it when SCAFFE_DEVICE_PATH is `direct` (the default), this rank's buffers are all device
memory served by one collectives.devices implementation, the fused kernel has the op and dtype, and
SCAFFE_REDUCE_ALGO does not send every call to native MPI (which then gets host copies).
Inside a node the local ranks' buffers are reduced through IPC (collectives.devices.ipc); across
nodes the leaders' chunked pipeline joins in (collectives.devices.nodes).

Every rank of a node must pass device buffers to a call when one does (or all host buffers): a node
whose ranks mix them needs SCAFFE_DEVICE_PATH=staged, which runs everything on host copies.
"""
import numpy

from collectives import devices
from collectives.devices import nodes
from collectives.ops import op_name, supports
from kernels._reduce_raw import dtypes

_KERNEL_DTYPES = frozenset(dtypes())


def direct(comm, kind, send, recv, op):
    """The Device that runs this call straight on device memory, or None when it is staged.

    `send`/`recv` are the call's collectives.buffers.Buffer objects (None where this rank has none; a
    Bcast's buffer is `recv`). When the answer is a Device, their `array` is set to their device views,
    which the validation and the Call then carry.
    """
    if comm.device_ipc is None or comm.forced == "native":
        return None
    given = [buf for buf in (send, recv) if buf is not None]
    if any(buf.device is None for buf in given) or given[0].device.size == 0:
        return None  # an empty buffer may have no allocation to export; staging it costs nothing
    dtype = numpy.dtype(given[0].device.dtype)
    if dtype not in _KERNEL_DTYPES or not dtype.isnative:
        return None
    if kind != "bcast":
        name = op_name(op)
        if name is None or not supports(name, dtype):
            return None
    device = devices.device_for(given[0].device)
    if device is None or any(devices.device_for(buf.device) is not device for buf in given[1:]):
        return None
    for buf in given:
        buf.array = buf.device
    return device


def start(comm, call, stream):
    """Mark the caller's stream now and return the call's work (see collectives.devices.ipc)."""
    if comm.several_nodes:
        return nodes.start(comm, call, stream)
    return local_call(comm, call).start(stream)


def local_call(comm, call):
    """This rank's part of `call` inside its node (a LocalCall, which a repeated call starts again), or
    None when the call spans nodes."""
    if comm.several_nodes:
        return None
    topology = comm.node_topology
    root = topology.local_rank_of[call.root] if call.kind != "allreduce" else 0
    return comm.device_ipc.local_call(call.device, call.kind, call.send, call.recv, call.op_name, root)
