"""Turns SIGINT/SIGHUP (and SIGTERM) into solver requests (stop, snapshot, none), like Caffe's SignalHandler."""
import signal
import threading

NONE, STOP, SNAPSHOT = "none", "stop", "snapshot"
ACTIONS = (STOP, SNAPSHOT, NONE)


def parse_action(name, flag="sigint_effect"):
    if name not in ACTIONS:
        raise ValueError(f"--{flag}={name!r}: must be one of {', '.join(ACTIONS)}")
    return name


class SignalHandler:
    """Installs handlers that only record the signal; the solver asks `action()` once per
    iteration (and per test batch) and acts at a safe point, so a snapshot is never half written.

    SIGTERM gets the SIGINT effect: batch schedulers send SIGTERM before killing a job, and the
    default effect "stop" makes the solver write a final snapshot and exit cleanly.
    """

    def __init__(self, sigint_effect=STOP, sighup_effect=SNAPSHOT, install=True):
        self.sigint_effect = parse_action(sigint_effect, "sigint_effect")
        self.sighup_effect = parse_action(sighup_effect, "sighup_effect")
        self._got_sigint = False
        self._got_sighup = False
        self._previous = {}
        if install:
            self.install()

    def install(self):
        # Python only lets the main thread install handlers; elsewhere signals keep their defaults.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in ((signal.SIGINT, self._on_sigint), (signal.SIGTERM, self._on_sigint),
                             (getattr(signal, "SIGHUP", None), self._on_sighup)):
            if sig is not None:
                self._previous[sig] = signal.signal(sig, handler)

    def restore(self):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _on_sigint(self, signum, frame):
        self._got_sigint = True

    def _on_sighup(self, signum, frame):
        self._got_sighup = True

    def action(self):
        """The requested action since the last call (each signal is reported once)."""
        if self._got_sigint:
            self._got_sigint = False
            return self.sigint_effect
        if self._got_sighup:
            self._got_sighup = False
            return self.sighup_effect
        return NONE

    __call__ = action

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False
