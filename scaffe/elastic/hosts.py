"""The hosts an elastic job may run on, as `host:slots` lines: printed by a discovery script (Horovod's
--host-discovery-script) or held in a hostfile (mpirun_rsh's and hydra's `host` or `host:N` lines)."""
import subprocess
import typing

# This machine alone (no discovery script, no hostfile): launchers get no host list, only a rank count.
LOCALHOST = "localhost"

# A discovery script that takes longer is treated as one that failed.
DISCOVERY_TIMEOUT_S = 30


class HostListError(ValueError):
    """A host list that cannot be read: a bad line, a failing discovery script, an unreadable hostfile."""


class Host(typing.NamedTuple):
    name: str
    slots: int  # ranks it takes


def parse_hosts(text, source):
    """The Hosts of `text`'s lines (`host` for one slot, `host:slots`); blank lines and `#` comments are
    skipped. `source` names where the text came from, for the error message."""
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, slots = line.partition(":")
        if not name or " " in name or (slots and not (slots.isdigit() and int(slots) > 0)):
            raise HostListError(f"{source} line {number}: {line!r} is not `host` or `host:slots` (slots >= 1)")
        if any(host.name == name for host in hosts):
            raise HostListError(f"{source} line {number}: host {name} is listed twice")
        hosts.append(Host(name, int(slots or 1)))
    return hosts


class HostSource:
    """Where the hosts come from, asked again at every decision: a discovery script, a hostfile, or this
    machine with `local_slots` ranks."""

    def __init__(self, discovery_script="", hostfile="", local_slots=1):
        if discovery_script and hostfile:
            raise HostListError("give --host-discovery-script or --hostfile, not both")
        self.discovery_script = discovery_script
        self.hostfile = hostfile
        self.local_slots = local_slots

    @property
    def local(self):
        return not (self.discovery_script or self.hostfile)

    def discover(self):
        """The hosts listed now, in their order."""
        if self.discovery_script:
            return parse_hosts(self._run_script(), self.discovery_script)
        if self.hostfile:
            try:
                with open(self.hostfile, encoding="utf-8") as f:
                    return parse_hosts(f.read(), self.hostfile)
            except OSError as e:
                raise HostListError(f"cannot read hostfile {self.hostfile}: {e.strerror}") from None
        return [Host(LOCALHOST, self.local_slots)]

    def _run_script(self):
        try:
            done = subprocess.run([self.discovery_script], capture_output=True, text=True,
                                  timeout=DISCOVERY_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HostListError(f"host discovery script {self.discovery_script} did not run: {e}") from None
        if done.returncode != 0:
            why = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise HostListError(f"host discovery script {self.discovery_script} failed: {why[0]}")
        return done.stdout
