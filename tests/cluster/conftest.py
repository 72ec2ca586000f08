"""Tests on several hosts made on this machine (jobs/cluster.sh): they need root and network namespaces,
as in CI, and skip with the reason elsewhere. One bed of 2 hosts per module, taken down even on failure."""
import sys
from pathlib import Path

import pytest

# The multi-rank harness and worker scripts of the collectives tests serve the bed too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectives"))

from netns_bed import Bed  # noqa: E402


def bed_of_two(**up_options):
    """A bed of 2 hosts for the life of a fixture: `yield from bed_of_two(...)`."""
    hosts = Bed(hosts=2)
    hosts.up(**up_options)
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="module")
def bed():
    yield from bed_of_two()


@pytest.fixture(scope="module")
def mnist():
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    ensure_mnist_lmdb(str(Path(__file__).resolve().parents[2] / "examples" / "mnist"))
