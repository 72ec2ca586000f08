"""Caffe's Timer (pycaffe's caffe.Timer): milliseconds between start() and stop(), on the host clock, or
between CUDA events on the current stream for work on a GPU (the device's time, not the launches')."""
import time

import numpy

from scaffe.log import get_logger

log = get_logger(__name__)


class Timer:
    """`start()`, `stop()` and `ms`, as Caffe's Timer: starting a running timer or stopping a stopped one
    does nothing, and reading `ms` stops a running one. `xp`: numpy for the host clock, cupy for events.
    Unlike Caffe's CPU timer, whose boost clock counts whole milliseconds, `ms` keeps the fraction."""

    def __init__(self, xp=numpy):
        self._xp = xp
        self._started = self._stopped = None
        self.running = False

    def _stamp(self):
        if self._xp is numpy:
            return time.perf_counter()
        event = self._xp.cuda.Event()
        event.record()
        return event

    def start(self):
        if not self.running:
            self._started, self.running = self._stamp(), True

    def stop(self):
        if self.running:
            self._stopped, self.running = self._stamp(), False

    @property
    def ms(self):
        """Milliseconds from the last start() to the last stop() (or now, which stops the timer)."""
        if self._started is None:
            log.warning("Timer has never been run before reading time.")
            return 0.0
        self.stop()
        if self._xp is numpy:
            return (self._stopped - self._started) * 1e3
        self._stopped.synchronize()
        return float(self._xp.cuda.get_elapsed_time(self._started, self._stopped))
