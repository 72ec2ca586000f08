"""Chain: every rank forwards to the next, the shape for large messages (each link carries n bytes once)."""


def shape(rank, size, root):
    """(parent, children) of `rank` in the chain root <- root+1 <- ... <- root+size-1."""
    relative = (rank - root) % size
    parent = None if relative == 0 else (rank - 1) % size
    children = [(rank + 1) % size] if relative + 1 < size else []
    return parent, children
