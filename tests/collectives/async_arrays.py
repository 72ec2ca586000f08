"""numba device arrays whose copies are asynchronous on their stream, as numba's are on a GPU (tests only).

On a GPU, numba's view of a cupy array carries the stream cupy publishes in `__cuda_array_interface__`,
and `copy_to_host` / `copy_to_device` without a stream argument queue `cuMemcpy*Async` on it and
return at once. The CUDA simulator copies synchronously and hides that; these arrays keep the
simulator's storage but follow numba's rule, on a stream that runs its work later, in order.
"""
import queue
import random
import threading
import time

import numpy
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray


class LateStream:
    """A CUDA stream as one worker thread: queued work runs in order, each after a random delay of up to
    `max_delay_s`; `synchronize()` returns when everything queued so far has run."""

    def __init__(self, seed=0, max_delay_s=0.01):
        self._work = queue.Queue()
        self._random = random.Random(seed)
        self._max_delay_s = max_delay_s
        threading.Thread(target=self._loop, name="late-stream", daemon=True).start()

    def enqueue(self, work):
        self._work.put(work)

    def synchronize(self):
        self._work.join()

    def _loop(self):
        while True:
            work = self._work.get()
            time.sleep(self._random.uniform(self._max_delay_s / 4, self._max_delay_s))
            work()
            self._work.task_done()


class StreamedArray(FakeCUDAArray):
    """A flat simulator device array whose copies without a stream argument go on `self.stream`, late."""

    def copy_to_host(self, ary=None, stream=0):
        stream = stream or self.stream
        if not stream:
            return super().copy_to_host(ary)
        target = numpy.empty_like(self._ary) if ary is None else ary
        stream.enqueue(lambda: numpy.copyto(target, self._ary))  # reads device memory when it runs
        return target

    def copy_to_device(self, ary, stream=0):
        stream = stream or self.stream
        if not stream:
            return super().copy_to_device(ary)
        stream.enqueue(lambda: numpy.copyto(self._ary, ary))  # reads the host memory when it runs

    def read(self):
        """What a kernel queued on the array's stream now would read (waits for it)."""
        seen = []
        self.stream.enqueue(lambda: seen.append(self._ary.copy()))
        self.stream.synchronize()
        return seen[0]
