"""Turns SIGINT/SIGHUP/SIGTERM into solver requests (stop, snapshot), like Caffe's SignalHandler.

A request is a set of effects: {} (none), {stop}, {snapshot} or both. Ranks agree on one by adding
up per-rank flags in the order of `EFFECTS` (see scaffe.parallel), so every rank acts on the
same requests at the same iteration.
"""
import os
import signal
import threading

NONE, STOP, SNAPSHOT = "none", "stop", "snapshot"
ACTIONS = (STOP, SNAPSHOT, NONE)
EFFECTS = (STOP, SNAPSHOT)  # the order of the flags that ranks add up


def parse_action(name, flag="sigint_effect"):
    if name not in ACTIONS:
        raise ValueError(f"--{flag}={name!r}: must be one of {', '.join(ACTIONS)}")
    return name


def as_requests(action):
    """The set of effects an action stands for: an action name ("none", "stop", "snapshot") or a
    collection of them (what `SignalHandler.action` returns)."""
    if isinstance(action, str):
        return frozenset() if parse_action(action, "action") == NONE else frozenset((action,))
    return frozenset(parse_action(a, "action") for a in action) - {NONE}


def request_flags(requests):
    """One 0/1 flag per effect of `EFFECTS`: what a rank adds to the sum the ranks agree by."""
    return [1 if effect in requests else 0 for effect in EFFECTS]


def requests_from_flags(flag_sums):
    """The requests all ranks act on: every effect that at least one rank asked for."""
    return frozenset(effect for effect, total in zip(EFFECTS, flag_sums) if total > 0)


def keep_sighup_from_ucx(environ=os.environ):
    """UCX (the transport of MPICH and Open MPI) takes SIGHUP as its debug signal and replaces our
    handler when MPI starts; UCX_DEBUG_SIGNO=0 turns that off. A value the user set wins.
    Call before MPI is initialised (before `from mpi4py import MPI`)."""
    environ.setdefault("UCX_DEBUG_SIGNO", "0")


class SignalHandler:
    """Installs handlers that only record the signal; the solver (or the ranks' agreement) asks
    `action()` once per iteration and acts at a safe point, so a snapshot is never half written.

    SIGINT and SIGHUP request their configured effects. SIGTERM always requests snapshot and stop:
    batch schedulers send it before killing a job, and the job should leave a snapshot behind.
    """

    def __init__(self, sigint_effect=STOP, sighup_effect=SNAPSHOT, install=True):
        self.sigint_effect = parse_action(sigint_effect, "sigint_effect")
        self.sighup_effect = parse_action(sighup_effect, "sighup_effect")
        self._requested = set()
        self._previous = {}
        if install:
            self.install()

    def install(self):
        # Python only lets the main thread install handlers; elsewhere signals keep their defaults.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, effects in ((signal.SIGINT, {self.sigint_effect}), (signal.SIGTERM, {STOP, SNAPSHOT}),
                             (getattr(signal, "SIGHUP", None), {self.sighup_effect})):
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._recorder(effects - {NONE}))

    def _recorder(self, effects):
        def record(signum, frame):
            self._requested |= effects
        return record

    def restore(self):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def action(self):
        """The effects requested since the last call, as a frozenset (empty: none)."""
        requested, self._requested = self._requested, set()
        return frozenset(requested)

    __call__ = action

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False
