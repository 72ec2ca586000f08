"""`scaffe elastic` across the bed's hosts (jobs/cluster.sh mpiexec as its launcher): a rank killed on one host
sends the job on without that host from the newest commit, and a host appearing in discovery joins at the
next commit. Needs the training side of scaffe.elastic (skips without it)."""
import os
import re
import sys
from pathlib import Path

import pytest

from netns_bed import CLUSTER, REPO, Bed

sys.path.insert(0, str(REPO / "tests" / "scaffe"))
pytest.importorskip("scaffe.elastic.state", reason="the training side of scaffe.elastic is not merged yet")

from training_job import Job, write_tiny_solver  # noqa: E402


@pytest.fixture(scope="module")
def bed_of_four():
    hosts = Bed(hosts=4)
    hosts.up()
    try:
        yield hosts
    finally:
        hosts.down()


def addresses(bed):
    """The bed's host addresses, host 1 first."""
    lines = Path(f"/run/scaffe-bed/{bed.name}/hosts").read_text().split("\n")
    return [line.split()[0] for line in lines if line]


def test_a_killed_host_is_left_behind_and_a_new_one_joins(bed_of_four, mnist, tmp_path):
    bed = bed_of_four
    h1, h2, h3, h4 = addresses(bed)
    listed = tmp_path / "listed"
    listed.write_text(f"{h1}:1\n{h2}:1\n{h3}:1\n")
    discovery = tmp_path / "discover.sh"
    discovery.write_text(f"#!/bin/sh\ncat {listed}\n")
    discovery.chmod(0o755)
    solver = write_tiny_solver(tmp_path, batch=8, max_iter=240, display=1)  # 24 samples an iteration
    launcher = f"env {' '.join(bed.settings)} bash {CLUSTER} mpiexec"
    env = {"SCAFFE_COMMIT_ITERS": "20", "SCAFFE_COMMIT_DIR": str(tmp_path / "shm"), "SCAFFE_STALL_S": "10"}
    with Job(1, ["elastic", "--host-discovery-script", discovery, "--launcher", launcher, "--discovery-interval",
                 "1", "--max-restarts", "1", "--", sys.executable, "-m", "scaffe", "train", f"--solver={solver}"],
             env=env) as job:
        killed_at, at = job.iteration()
        while killed_at < 45:
            killed_at, at = job.iteration(at + 1)
        for pid in bed.pids(2):
            if b"train" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, 9)
        at, restart = job.wait_for(rf"restart 1 of at most 1: the job failed with exit status \d+; rank killed on "
                                   rf"{re.escape(h2)}; relaunching on {re.escape(h1)}:1,{re.escape(h3)}:1 \(2 ranks\) "
                                   rf"from iteration (\d+)", start=at)
        resumed = int(restart.group(1))
        assert resumed % 20 == 0 and 20 <= resumed <= killed_at
        at, _ = job.wait_for(r"Resuming from commit", start=at)
        listed.write_text(f"{h1}:1\n{h2}:1\n{h3}:1\n{h4}:1\n")
        at, growth = job.wait_for(rf"growing: .*; relaunching on {re.escape(h1)}:1,{re.escape(h3)}:1,{re.escape(h4)}:1 "
                                  r"\(3 ranks\) from iteration (\d+)", start=at)
        assert int(growth.group(1)) % 20 == 0 and int(growth.group(1)) > resumed
        assert job.finish(300) == 0, job.log[-3000:]
    assert "Optimization Done." in "".join(job.lines[at:])
