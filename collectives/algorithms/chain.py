"""Chain: every rank forwards to the next, the shape for large messages (each link carries n bytes once)."""


def shape(rank, size, root):
    """(parent, children) of `rank` in the chain root <- root+1 <- ... <- root+size-1."""
    relative = (rank - root) % size
    parent = None if relative == 0 else (rank - 1) % size
    children = [(rank + 1) % size] if relative + 1 < size else []
    return parent, children


def turns(rank, size, root):
    """(parent, children) of `rank` in each of the chains from `root` that take the other ranks in the same
    circular order, each starting from a different one, so that each non-root rank ends one of them.

    Along one chain a middle rank forwards a reduce's n bytes to the root and a broadcast's n bytes away from
    it: 2 n each way when both run at once. With a call's chunks taken along the turns in equal numbers, each
    non-root rank ends 1/(size-1) of them and carries (2 size - 3)/(size - 1) n each way (perf/RESULTS.md,
    "Chains in turn among node heads").
    """
    others = [(root + 1 + j) % size for j in range(size - 1)]
    routes = []
    for turn in range(max(1, size - 1)):
        order = [root] + others[turn:] + others[:turn]
        at = order.index(rank)
        routes.append((order[at - 1] if at else None, order[at + 1:at + 2]))
    return routes
