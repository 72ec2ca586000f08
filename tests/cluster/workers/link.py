"""Ranks 0 and 1 (one per host) swap argv[1] bytes twice with Sendrecv; rank 0 prints the seconds the
second swap took and the transport settings it runs with."""
import os
import sys
import time

import numpy
from mpi4py import MPI

world = MPI.COMM_WORLD
outgoing = numpy.ones(int(sys.argv[1]), numpy.uint8)
incoming = numpy.empty_like(outgoing)
peer = 1 - world.Get_rank()
world.Sendrecv(outgoing, peer, recvbuf=incoming, source=peer)  # connects
started = time.perf_counter()
world.Sendrecv(outgoing, peer, recvbuf=incoming, source=peer)
seconds = time.perf_counter() - started
if world.Get_rank() == 0:
    print(f"UCX {os.environ.get('UCX_TLS')} {os.environ.get('UCX_TCP_RX_SEG_SIZE')}")
    print(f"SWAP-SECONDS {seconds:.4f}\nWORKER-OK link", flush=True)
