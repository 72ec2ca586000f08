"""Turning a solver into a data-parallel one when the process was started by an MPI launcher."""
from scaffe.log import get_logger

log = get_logger(__name__)


def world():
    """(comm, rank, size) of MPI.COMM_WORLD; importing mpi4py initialises MPI (a singleton without a launcher)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


def quiet_non_root(rank):
    """Only the root logs progress, like Caffe's multi-GPU training; warnings still show everywhere."""
    if rank != 0:
        import logging
        get_logger().setLevel(logging.WARNING)


def shard_training_data(solver, rank, size):
    """Give every data layer of the training net this rank's shard; test nets keep reading everything.

    Data layers start reading at their first forward, so setting the shard after construction holds.
    """
    for layer in solver.net.layers:
        if hasattr(layer, "shard_count") or layer.type in ("Data", "HDF5Data"):
            layer.shard_rank, layer.shard_count = rank, size


def make_distributed(solver, comm, schedule):
    """Shard the data, wrap the communicator in scaffe's collectives and attach `schedule`."""
    import collectives
    from scaffe.parallel import attach
    rank, size = comm.Get_rank(), comm.Get_size()
    collectives.install_abort_hook(comm)
    shard_training_data(solver, rank, size)
    fast = collectives.Comm(comm)
    topology = fast.describe()  # collective: sets the communicator up on every rank
    if rank == 0:
        log.info("Data-parallel training on %d ranks (%s schedule); %s", size, schedule, topology)
    return attach(solver, fast, schedule)
