"""Where a schedule's collectives start: at once on the CPU; after per-layer CUDA events on a GPU.

On a GPU the training thread only queues work: layers run on the compute stream (the one current
when training starts), and the training thread never waits for the device inside an iteration. When
layer i's backward (or the root's update of layer i) has been queued, an event is recorded on the
compute stream; the communication thread makes its own stream wait for that event alone and starts
the collectives of layer i with `stream=` that stream, while the compute stream goes on with layer i-1.
A collective orders itself after the stream it is given (collectives.devices: `user_stream`); given
none, it would order itself after the legacy default stream, which is the compute stream in `scaffe
train`, and so after all the backward queued by then. Parameter broadcasts get the propagation stream
the same way. Parameters that arrived for the next iteration are marked per layer by an event on the
propagation stream, and layer i's forward waits for its own event on the device (S-Caffe's multi-stage
propagation), not for the whole transfer.

The solver's updates of pieces (the S-Caffe root's, every rank's in the allreduce schedule) run on an update
stream of their own, beside the layers: queued on the compute stream, an update would wait behind every
layer the host had queued by then, and the parameters' broadcast behind it. A piece's update follows its
collective, whose request completes when the sum is in the buffer; the update stream also waits for the
compute stream's clearing of the gradients at each iteration's start (`updates_after`, a held piece's update
writes them); the next forward of the piece's layers waits for its event (`updated`), and the compute stream
for all of them before the next iteration clears the gradients or anything reads the parameters
(`updates_done`).

Every collective of a schedule goes through one FIFO thread, so each rank starts them in its program
order, as MPI requires. Without MPI_THREAD_MULTIPLE no other thread may call MPI: the training thread
then waits for each event itself and starts the collective.
"""
import contextlib
import queue
import threading

from mpi4py import MPI

from collectives import events
from collectives.progress import current_device, use_device


class HostOrder:
    """CPU training: data is ready when the training thread gets to it; collectives start at once."""

    def mark(self):
        """What `start` must wait for before reading what the compute queued so far: nothing here."""
        return None

    @staticmethod
    def start(work, after=None, label=None):
        """`work(stream)` now: it starts a collective (labelled `label` for the timeline) on `stream` (None:
        host data, nothing to order after) and returns its request."""
        with events.labelled(label):
            return work(None)

    def parameters_arrived(self, layer_id):
        """Layer `layer_id`'s parameters arrived (its broadcasts completed); the host reads them directly."""

    def parameters_needed(self, layer_id):
        """Before layer `layer_id`'s forward: nothing to order on the host."""

    def updates_after(self, event):
        """The updates queued from now on follow event `event` of the compute stream: on the host they do."""

    @staticmethod
    def updating():
        """Where the solver's update of a piece runs: the training thread, in order."""
        return contextlib.nullcontext()

    def updated(self, layers):
        """The updates so far wrote the parameters of `layers`: what a broadcast of them starts after."""
        return None

    def updates_done(self):
        """The compute's later work follows every update so far: on the host it does."""

    @staticmethod
    def elapsed(start, end):
        """Seconds between two `mark`s as the device ran them: None on the host (the host's clock is the
        device's; its marks are None)."""
        return None


class Started:
    """A collective the communication thread starts: `request()` waits until it has (it may raise its error)."""
    __slots__ = ("_done", "_request", "_error")

    def __init__(self):
        self._done = threading.Event()
        self._request = self._error = None

    def request(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._request

    def Test(self):
        """MPI's Test: False while not even started."""
        return self._done.is_set() and self.request().Test()


class DeviceOrder:
    """GPU training (cupy or its stand-in): collectives start after events on the compute stream."""

    def __init__(self, cupy, layer_count):
        self.cupy = cupy
        self.compute = cupy.cuda.get_current_stream()
        self.propagation = cupy.cuda.Stream(non_blocking=True)
        self.communication = cupy.cuda.Stream(non_blocking=True)  # the gradients' collectives
        self.update = cupy.cuda.Stream(non_blocking=True)  # the solver's updates of pieces, beside the layers
        self._arrived = [None] * layer_count  # layer -> event on the propagation stream, until its forward
        self._queue = queue.Queue()
        self._thread = None
        self._threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE

    def mark(self):
        """An event after everything queued on the compute stream so far."""
        return self.compute.record()

    def start(self, work, after=None, label=None):
        """`work(stream)` (which starts a collective on `stream` and returns its request) with `stream` ordered
        after event `after` alone: the propagation stream for parameters (`label` ("parameters", ...)),
        the communication stream for the rest."""
        if not self._threaded:
            return self._started_now(work, after, label)
        started = Started()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, args=(current_device(),), name="scaffe-comm",
                                            daemon=True)
            self._thread.start()
        self._queue.put((work, after, label, started))
        return started

    def _loop(self, device):
        use_device(device)
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, after, label, started = item
            try:
                started._request = self._started_now(work, after, label)
            except BaseException as error:  # the training thread raises it when it asks for the request
                started._error = error
            finally:
                started._done.set()

    def _started_now(self, work, after, label):
        # The stream waits here, right before the collective marks it: a wait made earlier, in the training
        # thread, would let the mark cover the events of layers queued in between. It is also the current
        # stream meanwhile, which is the one cupy's arrays name in their __cuda_array_interface__.
        stream = self.propagation if label is not None and label[0] == "parameters" else self.communication
        if after is not None:
            stream.wait_event(after)
        with stream, events.labelled(label):
            return work(stream)

    def parameters_arrived(self, layer_id):
        """Layer `layer_id`'s broadcasts completed: what they queued on the propagation stream is marked."""
        self._arrived[layer_id] = self.propagation.record()

    def parameters_needed(self, layer_id):
        """Layer `layer_id`'s forward (queued next on the compute stream) waits for its parameters' event."""
        event, self._arrived[layer_id] = self._arrived[layer_id], None
        if event is not None:
            self.compute.wait_event(event)

    def updates_after(self, event):
        """The updates queued from now on wait for `event` (None: nothing to wait for)."""
        if event is not None:
            self.update.wait_event(event)

    def updating(self):
        """A `with` block whose kernels (a piece's update) go to the update stream."""
        return self.update

    def updated(self, layers):
        """An event after the updates queued so far, which wrote `layers`' parameters: each of their next
        forwards waits for it (`parameters_needed`); a broadcast of them starts after it."""
        event = self.update.record()
        for layer_id in layers:
            self._arrived[layer_id] = event
        return event

    def updates_done(self):
        """The compute stream's later work waits for every update queued so far."""
        self.compute.wait_event(self.update.record())

    def elapsed(self, start, end):
        """Seconds between events `start` and `end` of the compute stream as the device ran them (the host
        queues ahead of it); None while `end` has not completed (the host does not wait for it)."""
        if not end.done:
            return None
        return self.cupy.cuda.get_elapsed_time(start, end) / 1000

    def close(self):
        """Stop the communication thread (after the collectives handed to it have started)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def order_for(net):
    """The order a schedule starts its collectives in, for `net`'s arrays."""
    import numpy
    if net.xp is numpy:
        return HostOrder()
    return DeviceOrder(net.xp, len(net.layers))
