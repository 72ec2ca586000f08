"""The wrapped MPI library's own collectives: the latency choice for small messages, and the fallback."""
from mpi4py import MPI


def reduce(comm, call):
    MPI.Intracomm.Reduce(comm, call.send_spec, call.recv_spec, call.op, call.root)


def allreduce(comm, call):
    MPI.Intracomm.Allreduce(comm, call.send_spec, call.recv_spec, call.op)


def bcast(comm, call):
    MPI.Intracomm.Bcast(comm, call.recv_spec, call.root)
