"""The bed's link: with `up --rate`, traffic between hosts crosses it and tbf shapes it; what runs in a host gets
the bed's transport settings (UCX_TLS=self,tcp, UCX_TCP_RX_SEG_SIZE=1m)."""
import re
import sys
from pathlib import Path

import pytest

from conftest import bed_of_two
from mpi_harness import require_ok, run_command

WORKER = Path(__file__).resolve().parent / "workers" / "link.py"
RATE_BITS = 100e6
SWAP_BYTES = 8 << 20
BURST_BYTES = 262144  # cluster.sh's smallest tbf bucket, which the first bytes may pass through at once


@pytest.fixture(scope="module")
def shaped_bed():
    yield from bed_of_two(rate="100mbit")


def test_rate_shapes_traffic_between_hosts(shaped_bed):
    job = require_ok(run_command(shaped_bed.command(1, sys.executable, WORKER, SWAP_BYTES), timeout=60))
    assert "UCX self,tcp 1m" in job.stdout, job.stdout
    seconds = float(re.search(r"SWAP-SECONDS (\S+)", job.stdout).group(1))
    # Through shared memory the swap takes milliseconds; over the shaped link, at least its wire time.
    wire_seconds = (SWAP_BYTES - BURST_BYTES) * 8 / RATE_BITS
    assert seconds >= 0.8 * wire_seconds, f"{seconds:.3f} s, wire time {wire_seconds:.3f} s"
