"""What the collectives see and would do here: `mpiexec -n 4 python -m collectives.info`.

Prints the MPI library, the node topology, each rank's host, local rank and GPU, whether the MPI
library is CUDA-aware, and which algorithm the selection table picks for a few message sizes.
"""
import socket

from mpi4py import MPI

from collectives import algorithms, settings
from collectives.devices.pipeline import cuda_aware
from collectives.comm import Comm


def gpu_count():
    """CUDA devices numba sees (0 without a GPU; the simulator's stand-in device does not count)."""
    try:
        from kernels.numba_cuda import SIMULATED, cuda
        return 0 if SIMULATED or not cuda.is_available() else len(cuda.gpus)
    except Exception:  # no driver, broken install: no GPU for us
        return 0


def main():
    comm = Comm(MPI.COMM_WORLD)
    topology = comm.describe()
    topo = comm.node_topology
    count = gpu_count()
    gpu = settings.gpu_for(topo.local_rank, range(count), count) if count else None
    me = (comm.Get_rank(), socket.gethostname(), topo.local_rank, gpu, count)
    everyone = comm.gather(me, root=0)
    aware, why = cuda_aware()
    if comm.Get_rank() == 0:
        print(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"topology: {topology}")
        print(f"CUDA-aware MPI: {'yes' if aware else 'no'} ({why}); the leaders' device chunks go to MPI "
              f"{'directly' if aware else 'through pinned host memory'}")
        for rank, host, local, gpu, gpus in everyone:
            where = f"GPU {gpu} of {gpus}" if gpu is not None else "no GPU"
            print(f"rank {rank}: host {host}, local rank {local}, {where}")
        print("algorithm by message size, for a sum of float32 (SCAFFE_REDUCE_ALGO overrides):")
        for nbytes in (4, 64 << 10, 256 << 10, 1 << 20, 64 << 20):
            chosen = ", ".join(f"{kind} {algorithms.select(kind, nbytes, comm.forced, comm.several_nodes)}"
                               for kind in ("reduce", "allreduce", "bcast"))
            print(f"  {nbytes:>10} B: {chosen}")


if __name__ == "__main__":
    main()
