"""Turning a solver into a data-parallel one when the process was started by an MPI launcher."""
import os

from scaffe.log import get_logger, quiet_below

log = get_logger(__name__)

# Where each launcher leaves the process's rank on its host, most specific first: inside a Slurm
# allocation, mpiexec and mpirun_rsh also inherit SLURM_LOCALID from the batch step.
LOCAL_RANK_VARIABLES = (
    "MV2_COMM_WORLD_LOCAL_RANK",   # MVAPICH2's mpirun_rsh
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI's mpirun
    "MPI_LOCALRANKID",             # MPICH's hydra mpiexec, Intel MPI
    "PMI_LOCAL_RANK",              # PMI-2 launchers
    "SLURM_LOCALID",               # srun
)

# How a user chooses the BLAS library's threads; with any of them set, share_cores leaves BLAS alone.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def launcher_local_rank(environ=os.environ):
    """This process's rank among those on its host, as its launcher set it, or None without a launcher.

    Read before MPI starts, so that a rank can choose its GPU before anything touches one.
    """
    for name in LOCAL_RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise ValueError(f"{name}={value!r} is not a local rank (a number from 0); "
                                 f"the launcher's environment is damaged")
            return int(value)
    return None


def host_place(comm):
    """(this process's rank among the ranks of `comm` on its host, their number), from MPI's shared-memory
    split (collective): hosts as MPI sees them, whatever SCAFFE_RANKS_PER_NODE simulates."""
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    place = node.Get_rank(), node.Get_size()
    node.Free()
    return place


def node_local_rank(comm):
    """This process's rank among those of `comm` on its host (collective), or None for a single process,
    which picks its device as a process without a launcher does."""
    return None if comm.Get_size() == 1 else host_place(comm)[0]


def share_cores(host_ranks, environ=os.environ):
    """This rank's BLAS threads set to its share of its host's cores, `host_ranks` ranks sharing them, unless
    the user chose (BLAS_THREAD_VARIABLES): OpenBLAS starts a thread per core in every rank, and its threads
    spin while they wait, so ranks sharing a host slow each other down several times over
    (perf/RESULTS.md). Returns the threads this rank got, or None where the user chose."""
    if any(environ.get(name) for name in BLAS_THREAD_VARIABLES):
        return None
    from threadpoolctl import threadpool_limits
    threads = max(1, len(os.sched_getaffinity(0)) // host_ranks)
    threadpool_limits(limits=threads, user_api="blas")
    return threads


def world():
    """(comm, rank, size) of MPI.COMM_WORLD; importing mpi4py initialises MPI (a singleton without a launcher)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


def quiet_non_root(rank):
    """Only the root logs progress, like Caffe's multi-GPU training; warnings still show everywhere
    (unless minloglevel hides them too)."""
    if rank != 0:
        import logging
        quiet_below(logging.WARNING)


def shard_training_data(solver, rank, size):
    """Give every data layer of the training net this rank's shard (test nets: see share_testing).

    Data layers start reading at their first forward, so setting the shard after construction holds.
    """
    from scaffe.parallel.sharded_testing import SHARDED_SOURCES
    for layer in solver.net.layers:
        if layer.type in SHARDED_SOURCES:
            layer.shard_rank, layer.shard_count = rank, size


def share_testing(solver, comm):
    """Every rank tests its share of the batches when every test net can be sharded; otherwise the
    root tests alone (as Caffe does) and the other ranks drop their test nets."""
    from scaffe.parallel.sharded_testing import ShardedTesting, shardable
    if not solver.test_nets:
        return
    if all(shardable(net) for net in solver.test_nets):
        solver.test_sharding = ShardedTesting(comm, solver.test_nets)
        return
    if comm.Get_rank() == 0:
        log.warning("A test net reads from a source that cannot be sharded (Input, DummyData, MemoryData): "
                    "the root tests alone while the other ranks wait")
    else:
        for net in solver.test_nets:
            net.close()
        solver.test_nets = []


def training_records(net):
    """Records in the training data (the first data layer's database or HDF5 files), or None."""
    for layer in net.layers:
        if layer.type == "Data" and hasattr(layer, "database"):  # a modelled net's layers have none
            return len(layer.database)
        if layer.type == "HDF5Data":
            import h5py
            total = 0
            for path in layer.files:
                with h5py.File(path, "r") as f:
                    total += f[layer.dataset_names[0]].shape[0]
            return total
    return None


def describe_data_parallelism(solver, comm, host_rank):
    """The root's log lines on what the job trains on: global batch, ranks, hosts, shards, epoch
    (`host_rank`: this rank's place on its host, from host_place; collective)."""
    size = comm.Get_size()
    hosts = comm.allreduce(int(host_rank == 0))
    if comm.Get_rank() != 0:
        return
    per_rank, iter_size = solver.net.batch_size, solver.param.iter_size
    global_batch = per_rank * size * iter_size
    log.info("Global batch %d = %d per rank x %d ranks x iter_size %d; %d rank(s) on %d host(s)",
             global_batch, per_rank, size, iter_size, size, hosts)
    log.info("Training data sharded round-robin: rank r of %d reads records r, r+%d, r+%d, ... of one stream",
             size, size, 2 * size)
    records = training_records(solver.net)
    if records:
        log.info("Epoch: %d records = %s iterations of the global batch", records, f"{records / global_batch:g}")
    if solver.test_sharding is not None:
        log.info("Testing sharded by batch: rank r of %d runs test batches r, r+%d, ...; the root reports",
                 size, size)


def make_distributed(solver, comm, schedule):
    """Shard the data, wrap the communicator in scaffe's collectives and attach `schedule`."""
    import collectives
    from scaffe.parallel import attach
    rank, size = comm.Get_rank(), comm.Get_size()
    collectives.install_abort_hook(comm)
    host_rank, host_ranks = host_place(comm)
    threads = share_cores(host_ranks)
    if rank == 0 and threads is not None:
        log.info("BLAS: %d thread(s) per rank, its share of its host's cores (OPENBLAS_NUM_THREADS or "
                 "OMP_NUM_THREADS chooses otherwise)", threads)
    shard_training_data(solver, rank, size)
    fast = collectives.Comm(comm)
    topology = fast.describe()  # collective: sets the communicator up on every rank
    share_testing(solver, fast)
    if rank == 0:
        log.info("Data-parallel training on %d ranks (%s schedule); %s", size, schedule, topology)
    describe_data_parallelism(solver, fast, host_rank)
    return attach(solver, fast, schedule)
