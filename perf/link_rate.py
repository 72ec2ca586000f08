"""What a link really carries: MPI's own Sendrecv between the first and the last rank, both ways at once.

    jobs/cluster.sh run -n 1 .venv/bin/python -m perf.link_rate [-m BYTES] [-i ITERATIONS]

Run with one rank per host on the multi-host bed: tbf over veth does not deliver exactly the rate it
is given, and the overlap measurements need the real one. Prints the median seconds of one exchange
and the rate per direction in MB/s (10^6 bytes) and Gbit/s.
"""
import argparse
import statistics
import time

import numpy
from mpi4py import MPI


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--bytes", type=int, default=64 << 20, help="message size (default 64 MiB)")
    p.add_argument("-i", "--iterations", type=int, default=5, help="timed exchanges after one warm-up")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("perf.link_rate: needs 2 ranks or more (the first and the last exchange)")
    peer = {0: size - 1, size - 1: 0}.get(rank)
    send = numpy.ones(args.bytes, numpy.uint8)
    recv = numpy.empty_like(send)
    seconds = []
    for i in range(args.iterations + 1):
        comm.Barrier()
        start = time.perf_counter()
        if peer is not None:
            comm.Sendrecv(send, peer, 0, recv, peer, 0)
        if i:
            seconds.append(time.perf_counter() - start)
    if rank == 0:
        median = statistics.median(seconds)
        print(f"# {args.bytes} bytes each way between ranks 0 and {size - 1} ({MPI.Get_processor_name()}), "
              f"{args.iterations} exchanges: median {median:.3f} s (min {min(seconds):.3f}, max {max(seconds):.3f})")
        print(f"{args.bytes / median / 1e6:.1f} MB/s per direction = {args.bytes * 8 / median / 1e9:.3f} Gbit/s")


if __name__ == "__main__":
    main()
