"""The one launch shape of the project's elementwise GPU kernels, every one a grid-stride loop.

A thread per element up to MAX_BLOCKS blocks of THREADS, and the loop covers the rest. With it the
collectives' fused reduce runs as fast as a kernel written for one case (fewer blocks were slower:
perf/RESULTS.md, "The device path on a GPU").
"""
THREADS = 256
MAX_BLOCKS = 65536


def blocks(total):
    """The blocks of THREADS threads that a grid-stride kernel over `total` elements is launched with."""
    return max(1, min(MAX_BLOCKS, -(-total // THREADS)))
