"""Who shares a node with whom: the node split, the leaders communicator and simulated nodes.

`SCAFFE_RANKS_PER_NODE=L` cuts each physical node into groups of L consecutive local ranks (the last
group may be smaller), so one host can play several nodes and exercise the inter-node stage in CI.
"""
from mpi4py import MPI

from collectives import settings


class Topology:
    """Node membership of every rank of `comm`, plus the communicators the hierarchical algorithms use.

    node_comm:     the ranks of my (possibly simulated) node, ordered by their rank in `comm`.
    leaders_comm:  local rank 0 of every node, ordered by node (None on non-leaders).
    column_comm:   the ranks with my local rank on every node, ordered by node; only when there are
                   several nodes, all of one size (else None).
    node_of[r]:    node index of rank r; nodes are numbered by their lowest rank.
    local_rank_of[r], node_sizes[i], node_members[i] (ranks of node i in order).
    """

    def __init__(self, comm):
        shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        per_node = settings.ranks_per_node()
        if per_node is not None:
            self.node_comm = shared.Split(shared.Get_rank() // per_node, key=shared.Get_rank())
            shared.Free()
        else:
            self.node_comm = shared
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.local_rank = self.node_comm.Get_rank()
        self.local_size = self.node_comm.Get_size()
        lowest = self.node_comm.allreduce(self.rank, op=MPI.MIN)
        lowest_of = comm.allgather(lowest)
        node_ids = sorted(set(lowest_of))
        index = {lowest: i for i, lowest in enumerate(node_ids)}
        self.node_of = [index[lo] for lo in lowest_of]
        self.num_nodes = len(node_ids)
        self.node = self.node_of[self.rank]
        self.node_members = [[] for _ in node_ids]
        for r, node in enumerate(self.node_of):
            self.node_members[node].append(r)
        self.local_rank_of = [0] * self.size
        for members in self.node_members:
            for local, r in enumerate(members):
                self.local_rank_of[r] = local
        self.node_sizes = [len(m) for m in self.node_members]
        is_leader = self.local_rank == 0
        self.leaders_comm = comm.Split(0 if is_leader else MPI.UNDEFINED, key=self.node)
        if not is_leader:
            self.leaders_comm = None
        self.column_comm = None
        if self.num_nodes > 1 and len(set(self.node_sizes)) == 1:
            self.column_comm = comm.Split(self.local_rank, key=self.node)
        self._comm = comm
        self._heads = {}

    def heads_comm(self, root):
        """Communicator of one rank per node, where the root's node is represented by the root itself.

        Collective over all ranks (created on first use per root-local-rank, then cached), ordered by
        node, so the root's head index is `node_of[root]`. Returns None on ranks that are not heads.
        """
        root_local = self.local_rank_of[root]
        if root_local == 0:
            return self.leaders_comm
        key = (self.node_of[root], root_local)
        if key not in self._heads:
            root_node = self.node_of[root]
            is_head = self.rank == root if self.node == root_node else self.local_rank == 0
            heads = self._comm.Split(0 if is_head else MPI.UNDEFINED, key=self.node)
            self._heads[key] = heads if is_head else None
        return self._heads[key]

    def describe(self):
        return (f"{self.size} ranks on {self.num_nodes} node(s) of sizes {self.node_sizes}"
                + (f" (simulated: SCAFFE_RANKS_PER_NODE={settings.ranks_per_node()})"
                   if settings.ranks_per_node() else ""))

    def free(self):
        for heads in self._heads.values():
            if heads is not None:
                heads.Free()
        for owned in (self.leaders_comm, self.column_comm):
            if owned is not None:
                owned.Free()
        self.node_comm.Free()
