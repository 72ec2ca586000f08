"""The leaders' device pipeline on the CPU stand-in device, whose streams run late: exact results, and a
planted missing wait is caught (tests/collectives/workers/device_pipeline.py)."""
import pytest

from mpi_harness import launch, run_ok


@pytest.mark.parametrize("staging", ["pinned", "direct"])
def test_device_pipeline_matches_numpy(staging):
    run_ok(4, "device_pipeline.py", staging, "none", timeout=240)


@pytest.mark.parametrize("planted", ["upload", "download"])
def test_a_missing_wait_in_the_pipeline_gives_wrong_results(planted):
    job = launch(4, "device_pipeline.py", "pinned", planted, timeout=240)
    assert not job.timed_out and job.returncode != 0, job.report()
    assert "elements differ" in job.stderr, job.report()


@pytest.mark.parametrize("ranks_per_node,cuda_aware", [("2", "0"), ("1", "1")])
def test_device_collectives_across_simulated_nodes(ranks_per_node, cuda_aware):
    """Reduce, Allreduce, Bcast and their I* forms on stand-in device buffers over 4 ranks cut into nodes:
    the node stage through IPC, the leaders' pipeline staged through pinned memory or handed to MPI."""
    run_ok(4, "device_nodes.py", env=dict(SCAFFE_RANKS_PER_NODE=ranks_per_node, SCAFFE_CUDA_AWARE=cuda_aware,
                                          SCAFFE_CHUNK_BYTES="4096"), timeout=300)
