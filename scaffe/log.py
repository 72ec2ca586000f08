"""Logging in glog's line format (`I20261123 08:32:31.818061 17459 solver.py:239] msg`) for scaffe's loggers,
and glog's settings, which every scaffe command and tool reads here and nowhere else.

The settings are glog's, as Caffe's tools take them: from the environment (`GLOG_minloglevel=1`) or the
command line (`--minloglevel=1`, `-minloglevel 1`), the command line winning:

setting       values                    default   effect
minloglevel   0 INFO, 1 WARNING,        0         messages below this severity are dropped
              2 ERROR, 3 FATAL
logtostderr   true or false (1, 0, ...) false     true: stderr only, never log files, whatever log_dir says
log_dir       a folder                  unset     also write glog's log files there, one per severity

Every message that passes minloglevel goes to stderr, as Caffe's tools set glog's alsologtostderr. glog
writes its files to /tmp when log_dir is unset; scaffe writes files only where log_dir asks for them.
"""
import contextlib
import getpass
import logging
import os
import socket
import sys
import time
import typing
import warnings

import numpy

from scaffe.gflags import gflags_bool, take_flags

LOGGER_NAME = "scaffe"

_LEVEL_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
                  logging.CRITICAL: "F"}
# glog's severities in order (minloglevel counts them from 0), with the name of their log file.
SEVERITIES = ((logging.INFO, "INFO"), (logging.WARNING, "WARNING"), (logging.ERROR, "ERROR"),
              (logging.CRITICAL, "FATAL"))


def get_logger(name=None):
    """The logger for a scaffe module: `get_logger(__name__)` gives a child of the "scaffe" logger,
    so one handler on "scaffe" (installed by `setup_logging`) formats every message the same way."""
    if name is None or name == LOGGER_NAME:
        return logging.getLogger(LOGGER_NAME)
    if not name.startswith(LOGGER_NAME + "."):
        name = f"{LOGGER_NAME}.{name}"
    return logging.getLogger(name)


# ---------------------------------------------------------------- glog's settings

def take_glog_flags(argv):
    """(argv without glog's flags, {name: value text} of the glog flags it held), in any gflags spelling:
    `-minloglevel=1`, `--minloglevel 1`, `-logtostderr`, `--logtostderr=false`, `--nologtostderr`."""
    return take_flags(argv, ("minloglevel", "log_dir"), ("logtostderr",))


class LogSettings(typing.NamedTuple):
    """glog's settings in force: what `setup_logging` applies."""
    level: int  # the logging level of minloglevel's severity; above CRITICAL drops everything
    to_stderr_only: bool  # logtostderr
    log_dir: str  # "" for no log files


def read_settings(flags=None):
    """The LogSettings of the GLOG_* variables, overridden by `flags` ({name: text}, from take_glog_flags).
    A value of the wrong form is a ValueError naming the variable or flag."""
    def setting(name):
        if flags and name in flags:
            return f"--{name}", flags[name]
        return f"GLOG_{name}", os.environ.get(f"GLOG_{name}", "").strip()

    where, text = setting("minloglevel")
    try:
        min_severity = int(text or 0)
    except ValueError:
        raise ValueError(f"{where} must be a severity number (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL), "
                         f"got {text!r}") from None
    where, text = setting("logtostderr")
    to_stderr_only = gflags_bool(text or "false")
    if to_stderr_only is None:
        raise ValueError(f"{where} must be true or false (1 or 0), got {text!r}")
    level = SEVERITIES[min_severity][0] if 0 <= min_severity < len(SEVERITIES) else (
        logging.INFO if min_severity < 0 else logging.CRITICAL + 1)
    return LogSettings(level, to_stderr_only, setting("log_dir")[1])


# ---------------------------------------------------------------- handlers

class GlogFormatter(logging.Formatter):
    """Formats records the way glog does, so tools that parse Caffe logs parse ours too.

    glog writes `<L><yyyymmdd> <hh:mm:ss.uuuuuu> <thread id> <file>:<line>] <message>`; we put
    the process id where glog puts the thread id, which is what it shows for a single-threaded
    Caffe, and keeps lines from different MPI ranks apart.
    """

    def format(self, record):
        letter = _LEVEL_LETTERS.get(record.levelno, "I")
        t = time.localtime(record.created)
        micros = int((record.created - int(record.created)) * 1e6)
        prefix = (f"{letter}{time.strftime('%Y%m%d %H:%M:%S', t)}.{micros:06d} {record.process} "
                  f"{os.path.basename(record.pathname)}:{record.lineno}] ")
        text = prefix + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of the message, so replacing sys.stderr
    (pytest's capture, a GUI) after logging was set up still gets the lines, and never a
    stream that has since been closed."""

    def __init__(self):
        super().__init__(sys.stderr)

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


class GlogFile(logging.FileHandler):
    """One of glog's log files: `<program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd-hhmmss>.<pid>` in
    `log_dir`, holding the messages of its severity and above. Like glog it is created at its first
    message, starts with glog's three header lines, and `<program>.<SEVERITY>` links to the newest one."""

    def __init__(self, log_dir, program, level, severity):
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "invalid-user"  # glog's name when it cannot tell
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{program}.{socket.gethostname()}.{user}.log.{severity}.{stamp}.{os.getpid()}"
        self.link = os.path.join(log_dir, f"{program}.{severity}")
        super().__init__(os.path.join(log_dir, name), delay=True)
        self.setLevel(level)
        self.setFormatter(GlogFormatter())

    def _open(self):
        os.makedirs(os.path.dirname(self.baseFilename), exist_ok=True)
        stream = super()._open()
        stream.write(f"Log file created at: {time.strftime('%Y/%m/%d %H:%M:%S')}\n"
                     f"Running on machine: {socket.gethostname()}\n"
                     f"Log line format: [IWEF]yyyymmdd hh:mm:ss.uuuuuu processid file:line] msg\n")
        try:
            if os.path.lexists(self.link):
                os.remove(self.link)
            os.symlink(os.path.basename(self.baseFilename), self.link)
        except OSError:
            pass  # glog too goes on without its link (another rank may have just made it)
        return stream


_handlers = []


def setup_logging(flags=None, program="scaffe", stream=None):
    """Applies glog's settings (the GLOG_* variables, overridden by the command line's `flags`, see
    `read_settings`) to the "scaffe" loggers: messages below minloglevel are dropped, the rest go to
    `stream` (stderr by default) and, with log_dir, to `program`'s glog log files.

    Idempotent: calling it again replaces (and closes) the previous handlers, so the CLI and tests can
    both call it. Returns the "scaffe" logger.
    """
    settings = read_settings(flags)
    logger = logging.getLogger(LOGGER_NAME)
    while _handlers:
        handler = _handlers.pop()
        logger.removeHandler(handler)
        handler.close()
    console = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    console.setFormatter(GlogFormatter())
    _handlers.append(console)
    if settings.log_dir and not settings.to_stderr_only:
        # As in glog, a message goes to the file of its severity and to those of the severities below.
        _handlers.extend(GlogFile(settings.log_dir, program, level, severity) for level, severity in SEVERITIES)
    for handler in _handlers:
        logger.addHandler(handler)
    logger.setLevel(settings.level)
    # Messages stop here: a root handler set up by an application would print them twice.
    logger.propagate = False
    return logger


@contextlib.contextmanager
def warnings_logged():
    """Python's warnings (numpy's "invalid value encountered in matmul" on a NaN weight, say) as glog WARNING
    lines while inside, so that a command's stderr holds glog lines and at most its one error line."""
    with warnings.catch_warnings():
        warnings.showwarning = _log_warning
        yield


def _log_warning(message, category, filename, lineno, file=None, line=None):
    get_logger("scaffe.warnings").warning("%s: %s (%s:%d)", category.__name__, message, os.path.basename(filename),
                                          lineno)


def quiet_below(level):
    """Raises the "scaffe" loggers' threshold to `level` (never lowers what minloglevel asked for)."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(max(logger.getEffectiveLevel(), level))


# ---------------------------------------------------------------- Caffe's numbers in log lines

def fmt(value):
    """A number the way C++ `ostream << float` prints it: 6 significant digits, %g style."""
    return f"{float(value):g}"


def output_line(name, value, loss_weight):
    """A net output as Caffe's solver and `caffe test` log it: `name = value`, and for a loss output
    ` (* weight = weighted loss)`, the product taken in float32 as Caffe's Dtype."""
    line = f"{name} = {fmt(value)}"
    if loss_weight:
        line += f" (* {fmt(loss_weight)} = {fmt(numpy.float32(loss_weight) * numpy.float32(value))} loss)"
    return line
