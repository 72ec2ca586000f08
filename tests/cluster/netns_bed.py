"""A multi-host bed for tests: jobs/cluster.sh's hosts (network namespaces on a bridge) under a name of
this test process, so that tests never meet another bed; skips where the machine cannot host one."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "jobs" / "cluster.sh"
CANNOT_HOST = 3  # cluster.sh's exit code for "this machine cannot host a bed"


class Bed:
    def __init__(self, hosts):
        self.hosts = hosts
        self.name = f"sc{os.getpid() % 100000}"
        # Spelled out in the command so that it reads whole in a failure report and survives any env filter.
        self.settings = [f"SCAFFE_BED={self.name}", f"MPIEXEC={Path(sys.executable).with_name('mpiexec')}"]

    def cluster(self, *args, timeout=60):
        return subprocess.run(["env", *self.settings, "bash", str(CLUSTER), *args], capture_output=True,
                              text=True, timeout=timeout)

    def up(self, rate=None, slurm=False):
        done = self.cluster("up", str(self.hosts), *(["--rate", rate] if rate else []),
                            *(["--slurm"] if slurm else []))
        if done.returncode == CANNOT_HOST:
            pytest.skip(f"no multi-host bed here: {done.stderr.strip()}")
        assert done.returncode == 0, f"cluster.sh up failed:\n{done.stdout}{done.stderr}"

    def down(self):
        done = self.cluster("down")
        assert done.returncode == 0, f"cluster.sh down failed:\n{done.stdout}{done.stderr}"

    def command(self, per_host, *argv):
        """The command line that runs argv on `per_host` ranks of every host."""
        return ["env", *self.settings, "bash", str(CLUSTER), "run", "-n", str(per_host), *map(str, argv)]

    def srun_command(self, *argv):
        """The command line that runs argv under the bed's Slurm (up with slurm=True), srun's flags first."""
        conf = f"/run/scaffe-bed/{self.name}/slurm/slurm.conf"
        return ["env", f"SLURM_CONF={conf}", "UCX_TLS=self,tcp", "srun", *map(str, argv)]

    def namespace(self, host):
        return f"{self.name}h{host}"

    def pids(self, host):
        """Processes running in host `host` (1-based) now."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespace(host)], capture_output=True, text=True,
                                timeout=30)
        return [int(p) for p in listed.stdout.split()]

    def ranks(self, host):
        """The `python -m scaffe ...` ranks running in host `host` now (not hydra's proxy or its shell)."""
        found = []
        for pid in self.pids(host):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if argv[1:3] == [b"-m", b"scaffe"]:
                found.append(pid)
        return found
