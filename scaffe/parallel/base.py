"""What every distributed schedule shares: wiring into the solver and net hooks, shards, buffers,
and the ranks' agreement on stop/snapshot requests."""
import numpy

from collectives import events
from scaffe import timeline
from scaffe.parallel.pieces import layer_pieces
from scaffe.parallel.streams import order_for
from scaffe.parallel.window import Windows
from scaffe.solvers.callbacks import SolverCallback
from scaffe.solvers.signals import EFFECTS, request_flags


class Schedule(SolverCallback):
    root = 0

    def __init__(self, solver, comm):
        self.solver = solver
        self.net = solver.net
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.params = self.net.learnable_params
        self.xp = self.net.xp
        self.order = order_for(self.net)  # when collectives may read what the compute produced
        self.windows = Windows(self.order)  # how many may be in flight on each communicator
        self.passes = 0
        solver.callbacks.append(self)
        self.net.add_hooks(on_param_needed=self.param_needed, on_grads_ready=self._layer_backward_done)
        modelled = hasattr(self.net, "idle_hooks")  # a modelled net (scaffe.modelled.net) computes as a wait
        if modelled:
            self.net.idle_hooks.append(self._idle)
        # Where a device computes (a GPU, or the model of one), the CPU is the collectives' alone.
        self.on_device = modelled or self.xp is not numpy
        solver.agreement = self
        self.agreed = frozenset()
        self.synced = False  # whether every rank holds the root's parameters
        # The ranks' requests travel with the gradients of the last layer whose backward makes some.
        ready = [layer_id for layer_id in range(len(self.net.layers)) if self.net.grads_ready_at(layer_id)]
        self.final_grads_layer = min(ready) if ready else None

    def duplicate(self):
        """A duplicate of the schedule's communicator, set up now on every rank (collective): set up at its
        first call instead, in the middle of the other communicators' traffic, such duplicates hung 2-rank
        LeNet (perf/RESULTS.md, "The window's stop, MPI's Ibcast under naps, buckets on two lanes")."""
        comm = self.comm.Dup()
        comm.describe()  # collective the first time: sets the communicator up
        return comm

    def _layer_backward_done(self, layer_id):
        self.grads_ready(layer_id)
        if layer_id == 0:  # hooks run from the last layer down to 0: this pass is complete
            self.passes += 1

    def last_pass(self):
        """True during the last of the solver's iter_size forward/backward passes of an iteration."""
        return self.passes == self.solver.param.iter_size - 1

    def grads_ready(self, layer_id):
        raise NotImplementedError

    def param_needed(self, layer_id):
        """Nothing to wait for unless the schedule moves parameters during forward."""

    def _idle(self):
        """While the device computes: the collectives queued for room start as it frees (a GPU's host thread
        is in `wait_all` by then), and the schedule takes in what has arrived."""
        self.windows.advance()
        self.progress()

    def progress(self):
        """While the device computes (a modelled net's waits): take in what has arrived, without waiting."""

    # ------------------------------------------------------------ stop/snapshot requests

    flag_count = len(EFFECTS)

    def local_flags(self):
        """This rank's requests since the last poll, one 0/1 flag per effect (signals.EFFECTS)."""
        return request_flags(self.solver.local_requests())

    def agreed_requests(self):
        """The requests every rank acts on at the end of this iteration: the same set on all ranks."""
        return self.agreed

    def parameters_by_layer(self):
        """(layer index, flat data) of every learnable blob, in the forward order of their first use: one
        array per blob, or, where the solver keeps flat buffers, one slice per layer (one message each)."""
        for layer_id in range(len(self.net.layers)):
            for piece in layer_pieces(self.solver, self.net.params_needed_at(layer_id)):
                yield layer_id, piece.data

    def on_test_start(self):
        self.sync_once()  # a test before the first iteration needs the root's parameters too

    def sync_once(self):
        if not self.synced:
            self.broadcast_parameters()
            self.synced = True

    def broadcast_parameters(self):
        """Every rank takes the root's parameters (blocking)."""
        for layer_id, data in self.parameters_by_layer():
            with events.labelled(("parameters", (layer_id,))):
                self.comm.Bcast(data, root=self.root)

    def arrived(self, entries, first, wait):
        """`entries[first:]` (each ending with its request) in order while their requests have completed,
        the first still in flight ends it; with `wait`, all of them, waiting for each in turn."""
        for entry in entries[first:]:
            if wait:
                self.wait_all([entry[-1]], "gradients")
            elif not entry[-1].Test():
                return
            yield entry

    def start(self, comm, work, after=None, label=None):
        """Start collective `work(stream)` on `comm` once event `after` has completed and `comm` has room for
        it (scaffe.parallel.window); returns its handle for `wait_all` and `arrived`."""
        return self.windows.start(comm, work, after, label)

    def wait_all(self, requests, what, layer_id=None):
        """Wait for `requests` (handles of `start`, or None); a recording timeline shows it as a wait for `what`."""
        if not any(request is not None for request in requests):
            return
        with timeline.waiting(what, layer_id):
            self.windows.wait(requests)

    @staticmethod
    def buffer(array):
        """A flat contiguous view: what MPI sends. Blobs are contiguous by construction."""
        return array.reshape(-1)
