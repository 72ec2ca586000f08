"""A validated collective (`Call`): what the planning (collectives.planning) hands the algorithms."""


class Call:
    """One validated collective: flat numpy views of its buffers, its op and root.

    `send` is None for a Bcast (its buffer is `recv`), `recv` None on a Reduce rank that receives
    nothing. `staging` is set when device buffers stand behind the host views; `computed` is False when
    only native MPI can do the work (which, staged, it does on the host views rather than the user's buffers).
    `device` is set when send and recv are device views that collectives.devices.direct reduces directly;
    `stream` is then the stream their exporters name (collectives.buffers.named_stream), else None.
    """

    __slots__ = ("kind", "send", "recv", "op", "op_name", "root", "dtype", "nbytes", "staging", "computed", "device",
                 "stream")

    def __init__(self, kind, send, recv, op, name, root, staging=None, computed=True, device=None, stream=None):
        self.kind, self.send, self.recv = kind, send, recv
        self.op, self.op_name, self.root = op, name, root
        message = send if send is not None else recv
        self.dtype, self.nbytes = message.dtype, message.nbytes
        self.staging, self.computed, self.device, self.stream = staging, computed, device, stream
