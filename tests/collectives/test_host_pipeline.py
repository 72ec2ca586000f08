"""The host pipeline among node heads: trees, a chain and chains taken in turn, exact results
(tests/collectives/workers/host_pipeline.py)."""
import pytest

from mpi_harness import run_ok


@pytest.mark.parametrize("ranks", [3, 4, 5])
def test_host_pipeline_matches_numpy(ranks):
    run_ok(ranks, "host_pipeline.py", timeout=240)
