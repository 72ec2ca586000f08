"""`scaffe elastic`: launches `scaffe train` through an MPI launcher on the hosts available, and when the job
fails, launches it again on the hosts that still answer from the newest commit that survives on one of them
(or, when discovery shows new hosts, stops it at its next commit and launches it bigger), until it ends,
fewer than --min-np ranks remain, or --max-restarts is spent.

The commits are the training side's (scaffe.elastic.state): directories D/iter_<N> in every host's memory
(D = SCAFFE_COMMIT_DIR), listed there by `scaffe commits --dir D`, which is also how a host is asked whether
it answers. Every rank reads the commit it resumes from in its own host's memory, so before a relaunch the
supervisor copies the chosen commit from a host that holds it to the hosts of the new job that lack it
(scaffe.elastic.spread, run through the launcher on one rank per host); that holder goes first in the host
list, where rank 0 runs.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import typing

from scaffe.elastic.growth import EXIT_GROW
from scaffe.elastic.hosts import Host, HostListError, HostSource
from scaffe.elastic.launchers import Launcher, LostHosts
from scaffe.elastic.settings import AUTO, COMMITS_ROOT, DEFAULT_LOST_S
from scaffe.log import get_logger

log = get_logger(__name__)

# The words of the training command that a commit replaces on a relaunch (its weights and solver state).
RESUME_FLAGS = ("snapshot", "weights", "resume-commit")
# Writing a big net's commit as a snapshot, or copying it to another host, may take a while; a host that takes
# longer has failed.
SNAPSHOT_TIMEOUT_S = 600
# Once the stall inspector's report names a lost rank, the launcher has this long to end the job itself.
LAUNCHER_GRACE_S = 2  # hydra ends an aborted job in well under a second; srun waits for the lost node
_LOST_POLL_S = 0.25


class ElasticError(RuntimeError):
    """A `scaffe elastic` command line that cannot run."""


class Commit(typing.NamedTuple):
    iteration: int
    path: str
    holders: tuple  # names of the answering hosts that hold it


# ---------------------------------------------------------------- the command line

def parse_command_line(argv):
    """(the supervisor's options, the training command's words) of `scaffe elastic [options] -- COMMAND`."""
    split = argv.index("--") if "--" in argv else len(argv)
    options = _parser().parse_args(argv[:split])  # first, so that --help works alone
    train = argv[split + 1:]
    if not train:
        raise ElasticError("give the training command after --: scaffe elastic [options] -- scaffe train --solver=S")
    if "train" not in train:
        raise ElasticError(f"the command after -- must be `scaffe train ...`, not {shlex.join(train)!r}")
    if options.min_np < 1 or (options.max_np is not None and options.max_np < options.min_np):
        raise ElasticError(f"--min-np {options.min_np} --max-np {options.max_np}: need 1 <= min-np <= max-np")
    if options.max_restarts < 0:
        raise ElasticError(f"--max-restarts {options.max_restarts}: give 0 or more")
    return options, train


def _parser():
    p = argparse.ArgumentParser(prog="scaffe elastic", usage="scaffe elastic [options] -- scaffe train ...")
    p.add_argument("--min-np", type=int, default=1, help="end (with a snapshot) when fewer ranks remain")
    p.add_argument("--max-np", type=int, default=None, help="use at most this many ranks (default: every slot)")
    p.add_argument("--host-discovery-script", default="", help="prints the hosts available, `host:slots` lines")
    p.add_argument("--hostfile", default="", help="the hosts, `host:slots` lines (default: this machine)")
    p.add_argument("--max-restarts", type=int, default=3, help="relaunches after failures before giving up")
    p.add_argument("--launcher", default="mpiexec",
                   help="the launcher command: mpiexec (hydra), jobs/cluster.sh mpiexec, mpirun_rsh, "
                        "jobs/mpirun_rsh.sh or srun")
    p.add_argument("--probe-timeout", type=float, default=10.0,
                   help="seconds a host has to answer `scaffe commits` before it counts as lost")
    p.add_argument("--discovery-interval", type=float, default=5.0,
                   help="seconds between looks for new hosts while the job runs")
    return p


def _flag_value(words, name):
    """The value of flag `name` in `words`, in any of Caffe's and GNU's spellings, or ""."""
    for i, word in enumerate(words):
        for dashes in ("-", "--"):
            if word == dashes + name and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(f"{dashes}{name}="):
                return word.split("=", 1)[1]
    return ""


def _without_flags(words, names):
    """`words` without flags `names` (with their values), in any spelling."""
    kept, skip = [], False
    for word in words:
        bare = word.lstrip("-").split("=", 1)[0]
        if skip or (word.startswith("-") and bare in names):
            skip = not skip and "=" not in word
            continue
        kept.append(word)
    return kept


# ---------------------------------------------------------------- the supervisor

class Supervisor:
    """One elastic run: the training command `train`, the supervisor's `options`, and the environment it
    gives the job (`environ`: where SCAFFE_JOB_ID, SCAFFE_COMMIT_DIR and SCAFFE_COMMIT_ITERS are read)."""

    def __init__(self, options, train, environ, work_dir):
        from scaffe.solvers import read_solver_file
        self.options = options
        self.train = train
        solver = _flag_value(train, "solver")
        if not solver:
            raise ElasticError("the training command needs --solver=S (its snapshot_prefix takes the last commit)")
        self.snapshot_prefix = read_solver_file(solver).snapshot_prefix
        self.job_id = environ.get("SCAFFE_JOB_ID") or f"{os.path.splitext(os.path.basename(solver))[0]}-{os.getpid()}"
        self.commit_dir = environ.get("SCAFFE_COMMIT_DIR") or os.path.join(COMMITS_ROOT, self.job_id)
        self.commit_iters = environ.get("SCAFFE_COMMIT_ITERS") or AUTO
        self.lost_s = environ.get("SCAFFE_LOST_S") or str(DEFAULT_LOST_S)
        self.scaffe = train[:train.index("train")]  # how this installation starts `scaffe`
        self.launcher = Launcher(shlex.split(options.launcher), work_dir)
        local_slots = options.max_np or options.min_np
        self.source = HostSource(options.host_discovery_script, options.hostfile, local_slots)
        self.excluded = set()  # hosts where a rank was killed or went silent: left out, as Horovod blacklists them

    def run(self):
        """Supervises the job to its end; returns the exit status (0: training done)."""
        hosts = self._placement(self.source.discover(), ())
        if self._ranks(hosts) < self.options.min_np:
            log.error("%d rank(s) on %s, fewer than --min-np %d: not starting", self._ranks(hosts),
                      _names(hosts), self.options.min_np)
            return 1
        log.info("launching on %s (%d ranks), committing into %s (SCAFFE_COMMIT_ITERS=%s)", _names(hosts),
                 self._ranks(hosts), self.commit_dir, self.commit_iters)
        commit, restarts = None, 0
        while True:
            status, lost = self._run_job(hosts, commit)
            if status == 0:
                return 0
            if status != EXIT_GROW:
                restarts += 1
                self.excluded |= lost.killed | lost.silent if not self.source.local else set()
            hosts, commit, why, lacking = self._next_launch(status, lost, hosts)
            if status != EXIT_GROW and restarts > self.options.max_restarts:
                return self._end(f"the job failed {restarts} times, more than --max-restarts "
                                 f"{self.options.max_restarts}", commit)
            if self._ranks(hosts) < self.options.min_np:
                return self._end(f"{why}; {self._ranks(hosts)} rank(s) left on the hosts that answer "
                                 f"({_names(hosts) or 'none'}), fewer than --min-np {self.options.min_np}", commit)
            self._copy_commit(commit, lacking)
            log.info("%s %s; relaunching on %s (%d ranks) from %s",
                     "growing:" if status == EXIT_GROW else f"restart {restarts} of at most "
                     f"{self.options.max_restarts}:", why, _names(hosts), self._ranks(hosts), _origin(commit))

    # ------------------------------------------------ deciding

    def _next_launch(self, status, lost, old_hosts):
        """(hosts, commit, why, hosts lacking the commit) of the launch after one that ended with `status` and
        lost the LostHosts `lost`: the hosts that answer (less the excluded, who are not asked), a holder of the
        newest commit among them first."""
        if status == EXIT_GROW:
            self._on_hosts(old_hosts, ["rm", "-f", self._grow_flag()])
        try:
            listed = self.source.discover()
        except HostListError as e:
            log.warning("%s; deciding on the hosts of the last launch", e)
            listed = old_hosts
        candidates = [host for host in listed if host.name not in self.excluded]
        commits = self.probe(candidates)
        answering = [host for host in candidates if host.name in commits]
        commit = newest_commit(commits)
        silent = [host.name for host in candidates if host.name not in commits]
        why = ("the job stopped at a commit for new hosts" if status == EXIT_GROW
               else f"the job failed with exit status {status}")
        why += "".join(f"; {label} {','.join(names)}" for label, names in
                       (("rank killed on", sorted(lost.killed)), ("stopped answering the job:", sorted(lost.silent)),
                        ("not answering:", silent)) if names)
        global_batch = self._global_batch(commit)
        hosts = self._placement(answering, commit.holders if commit else (), global_batch)
        if self._ranks(hosts) < self._ranks(self._placement(answering, ())):
            why += f"; the commit's global batch {global_batch} takes {self._ranks(hosts)} of the ranks"
        lacking = [host for host in hosts if commit and host.name not in commit.holders]
        return hosts, commit, why, lacking

    def _placement(self, hosts, holders, global_batch=0):
        """Up to --max-np slots of `hosts`, the hosts in `holders` first (rank 0 runs where the commit is), as
        many as divide `global_batch` where one is given (the resumed job splits it evenly, or refuses to start)."""
        left = min(self.options.max_np or self._ranks(hosts), self._ranks(hosts))
        while global_batch and left > 1 and global_batch % left:
            left -= 1
        placed = []
        for host in sorted(hosts, key=lambda host: host.name not in holders):
            if left > 0:
                placed.append(Host(host.name, min(host.slots, left)))
                left -= placed[-1].slots
        return placed

    def _global_batch(self, commit):
        """The global batch in `commit`'s commit.json (read on a holder through the launcher), 0 if unknown."""
        if commit is None:
            return 0
        program = ["cat", os.path.join(commit.path, "commit.json")]
        process = subprocess.Popen(self.launcher.command(self._holder(commit), program, beside_job=True),
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   start_new_session=True)
        try:
            out, _ = process.communicate(timeout=self.options.probe_timeout)
            return int(json.loads(out)["global_batch"]) if process.returncode == 0 else 0
        except subprocess.TimeoutExpired:
            _wait_or_kill(process, 0)
        except (ValueError, KeyError, TypeError):
            log.warning("%s/commit.json gives no global batch", commit.path)
        return 0

    @staticmethod
    def _ranks(hosts):
        return sum(host.slots for host in hosts)

    def _end(self, why, commit):
        """Ends the run: one line saying why, the newest commit written as a snapshot; returns 1."""
        log.error("ending: %s", why)
        if commit is None:
            log.error("no commit survives on a host that answers: no snapshot written")
            return 1
        program = self.scaffe + ["commit-to-snapshot", commit.path, "--prefix", self.snapshot_prefix]
        status = self._run_beside(self._holder(commit), program, SNAPSHOT_TIMEOUT_S)
        if status != 0:
            log.error("writing the commit of iteration %d as a snapshot on %s failed (exit status %s)",
                      commit.iteration, commit.holders[0], status)
        else:
            log.error("the commit of iteration %d is written as the snapshot %s_iter_%d.solverstate: resume with "
                      "scaffe train --snapshot", commit.iteration, self.snapshot_prefix, commit.iteration)
        return 1

    def _copy_commit(self, commit, lacking):
        """Copies `commit` from its first holder to the hosts `lacking` it."""
        if not lacking:
            return
        program = [sys.executable, "-m", "scaffe.elastic.spread", commit.path]
        status = self._run_beside(self._holder(commit) + [Host(host.name, 1) for host in lacking], program,
                                  SNAPSHOT_TIMEOUT_S)
        if status != 0:
            log.warning("copying the commit of iteration %d from %s to %s failed (exit status %s)", commit.iteration,
                        commit.holders[0], ",".join(host.name for host in lacking), status)

    def _holder(self, commit):
        return [Host(commit.holders[0], 1)]

    # ------------------------------------------------ running

    def _train_program(self, commit):
        words = self.train if commit is None else (_without_flags(self.train, RESUME_FLAGS)
                                                   + [f"--resume-commit={commit.path}"])
        settings = {"SCAFFE_JOB_ID": self.job_id, "SCAFFE_COMMIT_DIR": self.commit_dir,
                    "SCAFFE_COMMIT_ITERS": self.commit_iters, "SCAFFE_LOST_S": self.lost_s}
        # Through `env`, so that every launcher passes them (mpirun_rsh passes no environment of its own).
        return ["env"] + [f"{name}={value}" for name, value in settings.items()] + words

    def _run_job(self, hosts, commit):
        """Runs the training job on `hosts` to its end, asking it to grow when discovery shows new hosts;
        returns (its exit status, the LostHosts its output showed)."""
        lost = LostHosts(hosts)
        process = subprocess.Popen(self.launcher.command(hosts, self._train_program(commit)),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        relays = [threading.Thread(target=_relay, args=(stream, out, lost), daemon=True)
                  for stream, out in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))]
        for relay in relays:
            relay.start()
        known = {host.name for host in self._listed_quietly()} | {host.name for host in hosts}
        grow_asked = False
        while True:
            try:
                status = process.wait(timeout=self.options.discovery_interval if not lost.silent else _LOST_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if lost.silent and time.monotonic() - lost.silent_since > LAUNCHER_GRACE_S:
                    status = _end_launcher(process)
                    break
                grow_asked = grow_asked or self._ask_to_grow(hosts, known)
        for relay in relays:
            relay.join()
        return status, lost

    def _listed_quietly(self):
        try:
            return self.source.discover()
        except HostListError:
            return []

    def _ask_to_grow(self, hosts, known):
        """Creates D/GROW on the job's hosts when discovery lists hosts it did not list at launch and the
        job has room for them; returns whether it did."""
        if self.options.max_np is not None and self._ranks(hosts) >= self.options.max_np:
            return False
        new = [host.name for host in self._listed_quietly() if host.name not in known | self.excluded]
        if not new:
            return False
        folder = shlex.quote(self.commit_dir)
        self._on_hosts(hosts, ["sh", "-c", f"mkdir -p {folder} && : > {folder}/GROW"])
        log.info("new host(s) in discovery: %s; asked the job to stop at its next commit (%s)",
                 ",".join(new), self._grow_flag())
        return True

    def _grow_flag(self):
        return os.path.join(self.commit_dir, "GROW")

    def _on_hosts(self, hosts, program):
        """Runs `program` once on each of `hosts` through the launcher (beside the job, if one runs)."""
        one_each = [Host(host.name, 1) for host in hosts]
        status = self._run_beside(one_each, program, self.options.probe_timeout)
        if status != 0:
            log.warning("%s on %s: exit status %s", shlex.join(program), _names(one_each), status)

    def _run_beside(self, hosts, program, timeout):
        """The exit status of `program` run through the launcher on `hosts`, or None past `timeout` s."""
        process = subprocess.Popen(self.launcher.command(hosts, program, beside_job=True),
                                   stdout=subprocess.DEVNULL, start_new_session=True)
        return _wait_or_kill(process, timeout)

    def probe(self, hosts):
        """{name: [(iteration, path), ...] newest first} of the `hosts` that answer `scaffe commits` in
        time, all asked at once; a host missing from it did not answer."""
        program = self.scaffe + ["commits", "--dir", self.commit_dir]
        asked = {host.name: subprocess.Popen(self.launcher.command([Host(host.name, 1)], program, beside_job=True),
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                             start_new_session=True) for host in hosts}
        deadline = time.monotonic() + self.options.probe_timeout
        answers = {}
        for name, process in asked.items():
            try:
                # One that ended while an earlier one was awaited answered in time, however late it is read.
                left = None if process.poll() is not None else max(0.0, deadline - time.monotonic())
                out, _ = process.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                _wait_or_kill(process, 0)
                continue
            if process.returncode == 0:
                answers[name] = parse_commit_lines(out)
        return answers


def _end_launcher(process):
    """Ends a launcher that waits on a lost host (srun waits for a node behind a downed link to confirm that
    its task ended): SIGTERM, then SIGKILL. Returns its exit status."""
    log.warning("the launcher has not ended the job %d s after a rank was found lost: ending it", LAUNCHER_GRACE_S)
    process.terminate()
    try:
        return process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _relay(stream, out, lost):
    """Copies one of the launcher's output streams to ours (`out`) as it comes, showing each line to `lost`."""
    for line in stream:
        out.write(line)
        out.flush()
        lost.feed(line)


def _wait_or_kill(process, timeout):
    """`process`'s exit status within `timeout` s, else None after killing its session (the launcher and
    what it started here)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        return None


def parse_commit_lines(text):
    """[(iteration, path), ...] of `scaffe commits`' lines `<iter> <path>`; other lines are not commits."""
    found = []
    for line in text.splitlines():
        iteration, _, path = line.strip().partition(" ")
        if iteration.isdigit() and path:
            found.append((int(iteration), path.strip()))
    return found


def newest_commit(commits):
    """The newest Commit of {host: [(iteration, path), ...]} with the hosts that hold it, or None."""
    listed = [(iteration, path) for found in commits.values() for iteration, path in found]
    if not listed:
        return None
    iteration, path = max(listed)
    holders = tuple(name for name, found in commits.items() if (iteration, path) in found)
    return Commit(iteration, path, holders)


def _names(hosts):
    return ",".join(f"{host.name}:{host.slots}" for host in hosts)


def _origin(commit):
    return "the start (no commit yet)" if commit is None else f"iteration {commit.iteration} ({commit.path})"


def main(argv):
    """`scaffe elastic ARGS`; returns the exit status."""
    options, train = parse_command_line(list(argv))
    with tempfile.TemporaryDirectory(prefix="scaffe-elastic-") as work_dir:
        return Supervisor(options, train, os.environ, work_dir).run()
