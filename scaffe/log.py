"""Logging in glog's line format (`I20261123 08:32:31.818061 17459 solver.py:239] msg`) for scaffe's loggers."""
import logging
import os
import sys
import time

import numpy

LOGGER_NAME = "scaffe"

_LEVEL_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
                  logging.CRITICAL: "F"}


def get_logger(name=None):
    """The logger for a scaffe module: `get_logger(__name__)` gives a child of the "scaffe" logger,
    so one handler on "scaffe" (installed by `setup_logging`) formats every message the same way."""
    if name is None or name == LOGGER_NAME:
        return logging.getLogger(LOGGER_NAME)
    if not name.startswith(LOGGER_NAME + "."):
        name = f"{LOGGER_NAME}.{name}"
    return logging.getLogger(name)


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


_handler = None


def setup_logging(level=logging.INFO, stream=None):
    """Sends the "scaffe" loggers to `stream` (stderr by default, like GLOG_logtostderr=1).

    Idempotent: calling it again replaces the previous handler, so the CLI and tests can both
    call it. `SCAFFE_LOG_LEVEL` (DEBUG, INFO, WARNING, ...) overrides `level`.
    """
    global _handler
    logger = logging.getLogger(LOGGER_NAME)
    env_level = os.environ.get("SCAFFE_LOG_LEVEL")
    if env_level:
        level = getattr(logging, env_level.upper(), level)
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    _handler.setFormatter(GlogFormatter())
    logger.addHandler(_handler)
    logger.setLevel(level)
    # Messages stop here: a root handler set up by an application would print them twice.
    logger.propagate = False
    return logger


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
