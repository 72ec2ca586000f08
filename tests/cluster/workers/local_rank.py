"""Each rank reads its local rank from the launcher's environment before MPI starts; rank 0 prints, per
host (network namespace), the local ranks read and the ranks of the host's shared-memory communicator."""
import json
import os

from scaffe.parallel.launch import launcher_local_rank

read_before_mpi = launcher_local_rank()

from mpi4py import MPI  # noqa: E402  (imported here on purpose: this starts MPI)

world = MPI.COMM_WORLD
host = world.Split_type(MPI.COMM_TYPE_SHARED)
found = world.gather((os.readlink("/proc/self/ns/net"), read_before_mpi, host.Get_rank()), root=0)
if world.Get_rank() == 0:
    by_host = {}
    for namespace, read, shared_rank in found:
        by_host.setdefault(namespace, []).append([read, shared_rank])
    print("LOCAL-RANKS " + json.dumps(sorted(sorted(ranks) for ranks in by_host.values())))
    print("WORKER-OK local_rank", flush=True)
