"""How each MPI launcher is told to start ranks on chosen hosts: MPICH's hydra (`mpiexec -hosts h:s,... -n P`,
also `jobs/cluster.sh mpiexec` on the bed), MVAPICH2's mpirun_rsh (`-np P -hostfile F`, also
`jobs/mpirun_rsh.sh`) and Slurm's srun (`--ntasks P --nodes N --nodelist h,...`). The kind is read from the
launcher command's words; anything else is taken for hydra."""
import os
import re
import tempfile
import time

from collectives.stall_report import silent_ranks
from scaffe.elastic.hosts import LOCALHOST


# hydra's report of a rank that ended badly: "=   PID 123 RUNNING AT h2" ("=   RANK 1 PID 123 ..." before
# MPICH 4), then "=   EXIT CODE: 9" or "=   KILLED BY SIGNAL: 9 (Killed)".
_RUNNING_AT = re.compile(r"^=\s+(?:RANK \d+ )?PID \d+ RUNNING AT (\S+)")
_ENDED_WITH = re.compile(r"^=\s+(?:EXIT CODE|KILLED BY SIGNAL): (\d+)")
# srun's: "srun: error: node2: task 1: Killed" (or "tasks 0-3").
_SRUN_KILLED = re.compile(r"^srun: error: (\S+): tasks? [0-9,-]+: Killed")
# SIGKILL: kill -9, the kernel's OOM killer, a node's watchdog; not a bug that would fail on any host.
_HOST_FAULT_SIGNAL = 9


class LostHosts:
    """The hosts a job's output (its lines fed one by one, stdout's and stderr's) shows lost: `killed`, where
    the launcher reports a rank killed by SIGKILL (hydra and srun name them), and `silent`, where the stall
    inspector's report names a rank that stopped answering (SCAFFE_LOST_S). The job's ranks sit on `hosts` in
    order, slot after slot, as every launcher here places them."""

    def __init__(self, hosts):
        self.killed, self.silent = set(), set()
        self._rank_hosts = [host.name for host in hosts for _ in range(host.slots)]
        self._running_at = None
        self._srun_reported = False
        self.silent_since = None  # time.monotonic() of the first report of a lost rank

    def feed(self, line):
        running_at = _RUNNING_AT.match(line)
        if running_at:
            self._running_at = running_at.group(1)
            return
        ended = _ENDED_WITH.match(line)
        if ended and self._running_at and int(ended.group(1)) == _HOST_FAULT_SIGNAL:
            self.killed.add(self._running_at)
        # srun kills the other tasks itself once one has failed and says so the same way: only the first
        # report, and none after the stall inspector's, names a host's fault.
        srun_killed = _SRUN_KILLED.match(line)
        if srun_killed and not (self.silent or self._srun_reported):
            self.killed.add(srun_killed.group(1))
        self._srun_reported |= bool(srun_killed)
        silent = {self._rank_hosts[rank] for rank in silent_ranks(line) if rank < len(self._rank_hosts)}
        if silent and self.silent_since is None:
            self.silent_since = time.monotonic()
        self.silent |= silent


def launcher_kind(words):
    """hydra, mpirun_rsh or srun: the launcher a command line starts."""
    names = [os.path.basename(word) for word in words]
    if any(name.startswith("mpirun_rsh") for name in names):
        return "mpirun_rsh"
    if "srun" in names:
        return "srun"
    return "hydra"


def is_local(hosts):
    """Whether `hosts` is this machine alone, which launchers get as a rank count without a host list."""
    return len(hosts) == 1 and hosts[0].name == LOCALHOST


class Launcher:
    """A launcher command (its words, e.g. ["mpiexec"] or ["jobs/mpirun_rsh.sh"]) that turns a list of
    Hosts and a program into the command line running one rank per slot; hostfiles go to `work_dir`."""

    def __init__(self, words, work_dir):
        self.words = list(words)
        self.kind = launcher_kind(self.words)
        self.work_dir = work_dir

    def command(self, hosts, program, beside_job=False):
        """The command line that runs `program` (a list of words) on every slot of `hosts`; `beside_job`:
        while the training job holds those hosts (hydra and mpirun_rsh start it as any other)."""
        ranks = str(sum(host.slots for host in hosts))
        placement = getattr(self, f"_{self.kind}")(hosts, ranks, beside_job)
        return self.words + placement + list(program)

    def _hydra(self, hosts, ranks, beside_job):
        del beside_job  # hydra starts a second job beside the first as it starts any other
        if is_local(hosts):
            return ["-n", ranks]
        return ["-hosts", ",".join(f"{host.name}:{host.slots}" for host in hosts), "-n", ranks]

    def _mpirun_rsh(self, hosts, ranks, beside_job):
        del beside_job
        with tempfile.NamedTemporaryFile("w", dir=self.work_dir, prefix="hosts-", delete=False) as f:
            f.writelines(f"{host.name}:{host.slots}\n" for host in hosts)
        return ["-np", ranks, "-hostfile", f.name]

    def _srun(self, hosts, ranks, beside_job):
        # Every step shares its nodes (--overlap): the supervisor's side jobs run beside the training, and a
        # relaunch must start while Slurm still counts the failed step, which waits for a lost node, as running.
        del beside_job
        placement = ["--overlap", "--ntasks", ranks]
        if is_local(hosts):
            return placement
        return placement + ["--nodes", str(len(hosts)), "--nodelist", ",".join(host.name for host in hosts)]
