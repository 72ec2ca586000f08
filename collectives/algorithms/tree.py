"""Binomial tree: log2(P) steps, the shape for mid-sized messages."""


def shape(rank, size, root):
    """(parent, children) of `rank` in a binomial tree rooted at `root`; children nearest first."""
    relative = (rank - root) % size
    children = []
    mask = 1
    parent = None
    while mask < size:
        if relative & mask:
            parent = (relative - mask + root) % size
            break
        if relative + mask < size:
            children.append((relative + mask + root) % size)
        mask <<= 1
    return parent, children
