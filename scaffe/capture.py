"""A training iteration replayed from CUDA graphs: Python launches an iteration's kernels once, while the
stream is captured, and the GPU replays them after that, so a small net no longer pays a host call per kernel.

The iteration is the net's and the solver's steps (Net.run_step). The device work of a layer, of the loss,
of clearing the gradients and of the fused update is captured, each run of such steps into one graph. A
layer that says why it cannot be (Layer.capture_refusal: a new batch; GEMMs where nvmath-python is missing,
see kernels.blas) runs in its place between the graphs at every replay, as hooks and callbacks (HOST) do. The rate and the solver's scalars change from one iteration to the next, so the
captured update kernel reads them from a small device array written before each replay
(kernels.cuda_sources.from_device).

Its life: WARMUP_ITERATIONS run eagerly (buffers, cuDNN plans and workspaces are made then); the next one
is captured and checked: an eager iteration and a replayed one, from the same parameters, input and random
generators' state, must give the same loss, parameters, gradients and history, or capture is turned off with a
warning. Input layers (no bottoms) run first at every replay; if one moved or reshaped a blob, capture is
turned off and that iteration runs eagerly (with iter_size > 1 they run in their passes' places, and such a
change is an error). A layer whose capture raises an error (a host read, a library that refuses a capturing
stream) runs between the graphs from then on, and the iteration is captured again; an error in other work
turns capture off. Whatever turns capture off says why in one log line; SCAFFE_CAPTURE=0 turns it off.
Memory that captured work allocates comes from a pool of the graphs' own: cupy's shared pool would hand it
out again after the capture while the graphs still write it.
"""
import os

import numpy

from kernels.blas import prepare_capture
from scaffe.log import get_logger
from scaffe.net import HOST

log = get_logger(__name__)

WARMUP_ITERATIONS = 2
# Of an array's largest magnitude: eager and replayed results may differ by the order of floating-point
# atomics (cuDNN's filter gradients), not by more.
TOLERANCE = 1e-4


def capture_setting():
    """SCAFFE_CAPTURE: 1 (default) replays GPU iterations from CUDA graphs, 0 runs every one eagerly."""
    value = os.environ.get("SCAFFE_CAPTURE", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"SCAFFE_CAPTURE={value!r}: use 1 (replay from CUDA graphs) or 0 (eager)")
    return value == "1"


def _refusal(owner, failed):
    """Why layer record `owner`'s work stays out of the graphs, or None; `failed`: {layer id: why} of the layers
    whose capture raised an error."""
    return failed.get(id(owner.layer)) or owner.layer.capture_refusal()


def _kind(owner, failed):
    """None for a capturable step; "host" for a hook's; "input" or "layer" for a layer that refuses capture."""
    if owner is None:
        return None
    if owner is HOST:
        return "host"
    if _refusal(owner, failed) is None:
        return None
    return "layer" if owner.bottoms else "input"


class _Step:
    """A step kept to run in its place at every replay."""

    def __init__(self, kind, owner, work, args):
        self.kind, self.owner, self.work, self.args = kind, owner, work, args

    def run(self):
        self.work(*self.args)


class _Recording:
    """Net.tape while an iteration is captured: capturable steps run into the open capture, the rest are kept."""

    def __init__(self, stream, inputs_first, failed):
        self.stream = stream
        self.entries = []  # graphs and _Steps, in the iteration's order
        self.inputs = []  # with `inputs_first` (one pass an iteration), the input layers' steps, run first
        self.inputs_first = inputs_first
        self.failed = failed
        self.capturing = False
        self.raised = None  # the owner of the step whose capture raised an error

    def step(self, owner, work, args):
        kind = _kind(owner, self.failed)
        if kind is None:
            if not self.capturing:
                self.stream.begin_capture()
                self.capturing = True
            try:
                work(*args)
            except Exception:
                self.raised = owner
                raise
        elif kind == "input" and self.inputs_first:
            self.inputs.append(_Step(kind, owner, work, args))
        else:
            self.close()
            self.entries.append(_Step(kind, owner, work, args))

    def close(self):
        if self.capturing:
            self.capturing = False
            self.entries.append(self.stream.end_capture())

    def abandon(self):
        """Ends a capture an error interrupted; the error itself is what the caller reports."""
        if self.capturing:
            self.capturing = False
            try:
                self.stream.end_capture()
            except Exception:  # noqa: BLE001 - an invalidated capture refuses to end; the graph is dropped anyway
                pass

    def refusals(self):
        layers = [step.owner for step in self.inputs + self.entries if step.__class__ is _Step and step.kind != "host"]
        return {record.name: f"{record.layer.type}: {_refusal(record, self.failed)}" for record in layers}


class _Eager:
    """Net.tape for an eager iteration whose batch is in place already (its input layers are left out) and,
    for the self-check, without the hooks."""

    def __init__(self, with_hooks, failed):
        self.with_hooks = with_hooks
        self.failed = failed

    def step(self, owner, work, args):
        kind = _kind(owner, self.failed)
        if kind == "input" or (kind == "host" and not self.with_hooks):
            return
        work(*args)


class CapturedIteration:
    """The solver's iterations from CUDA graphs (see the module's docstring). `run(fetch)` replays one and
    returns its loss, or returns None where the solver runs the iteration eagerly."""

    def __init__(self, solver):
        self.solver, self.net = solver, solver.net
        self.off = "a CPU net" if self.net.xp is numpy else None
        if self.off is None and not capture_setting():
            self._turn_off("SCAFFE_CAPTURE=0")
        self.warmup = WARMUP_ITERATIONS
        self.recording = None
        self.failed = {}  # layer id -> why its capture raised an error: it runs between the graphs
        self._eager_tape = None

    def _turn_off(self, why, warn=False):
        self.off = why
        (log.warning if warn else log.info)("CUDA graphs off (%s): iterations run eagerly", why)

    def run(self, fetch):
        if self._eager_tape is not None and self.net.tape is self._eager_tape:
            self.net.tape = self._eager_tape = None
        if self.off is not None:
            return None
        if self.warmup:
            self.warmup -= 1
            return None
        if self.recording is not None:
            why = self._solver_refusal()  # something added since the capture (a timeline) may refuse it now
            if why is not None:
                self.recording = None
                self._turn_off(why)
                return None
            if self._hooks() != self.hooks:
                log.info("CUDA graphs: hooks or callbacks were added since the capture; capturing again")
                self.recording = None
        if self.recording is None and not self._start():
            return None
        return self._replay(fetch)

    def _hooks(self):
        """What a recording keeps to run between its graphs, besides layers: the hooks and callbacks."""
        net = self.net
        return (tuple(net.param_needed_hooks), tuple(net.after_forward_hooks), tuple(net.before_backward_hooks),
                tuple(net.grads_ready_hooks), tuple(self.solver.callbacks))

    # ------------------------------------------------------------ capture and self-check

    def _solver_refusal(self):
        solver = self.solver
        if getattr(solver, "flat", None) is None or not hasattr(solver, "update_parameters"):
            return "the solver keeps its learnables in no flat buffers (blobs of mixed types)"
        if solver.param.clip_gradients >= 0:
            return "clip_gradients reads the gradients' norm on the host"
        if self.net.layer_timed_hooks:
            return "the timeline records CUDA events around every layer"
        return None

    def _start(self):
        """Captures the iteration and checks it (see the module's docstring); False where capture is off now.
        The eager half of the check runs first, so that what an iteration compiles or allocates for the first
        time (the update kernel's `from_device` twin) happens before the capture, not in it."""
        why = self._solver_refusal()
        if why is not None:
            self._turn_off(why)
            return False
        # A schedule's updates and broadcasts still in flight would land during the self-check (every rank
        # captures at the same iteration, so the schedule's collectives still match).
        self.solver.parameters_read()
        xp = self.net.xp
        self.stream = xp.cuda.Stream(non_blocking=True)
        self.pool = xp.cuda.MemoryPool()
        self.scalars = xp.zeros(len(self._scalar_values(0.0)), dtype=numpy.float32)
        prepare_capture(xp)  # the captured GEMMs' cuBLAS handle, where nvmath-python is installed
        compared, written = self._state()
        arrays = [array for _, array in compared] + written
        before = [array.copy() for array in arrays]
        self._upload_scalars()
        self.net.tape = _Eager(with_hooks=False, failed=self.failed)
        try:
            eager = self._results(self._work(), compared)
        finally:
            self.net.tape = None
            _put_back(arrays, before)
        while not self._record():  # a layer whose capture raised an error runs between the graphs: again
            if self.off is not None:
                return False
        for name, reason in self.recording.refusals().items():
            log.info("CUDA graphs: layer %s runs between the graphs (%s)", name, reason)
        graphs = sum(1 for entry in self.recording.entries if entry.__class__ is not _Step)
        log.info("CUDA graphs: an iteration is %d graphs and %d steps between them", graphs,
                 len(self.recording.entries) + len(self.recording.inputs) - graphs)
        try:
            replayed = self._results(self._replay(fetch=False, checking=True), compared)
        finally:
            _put_back(arrays, before)
        difference = _difference(["the loss"] + [name for name, _ in compared], eager, replayed)
        if difference is not None:
            self.recording = None
            self._turn_off(difference, warn=True)
            return False
        return True

    def _record(self):
        """Captures the iteration; False where a step's capture raised an error: then the layer whose step it
        was runs between the graphs from now on (False to try again), or, for another step, capture is off."""
        xp = self.net.xp
        recording = _Recording(self.stream, self.solver.param.iter_size == 1, self.failed)
        self.hooks = self._hooks()
        self.net.tape = recording
        try:
            with self.stream, xp.cuda.using_allocator(self.pool.malloc):
                self.loss = self._work()
                recording.close()
        except Exception as error:  # noqa: BLE001 - what cannot be captured runs eagerly, as the log says
            why = f"{type(error).__name__}: {error}"
            if recording.raised is None:  # the net's or the solver's own work, or the capture's end
                self._turn_off(f"the capture failed: {why}", warn=True)
            else:
                self.failed[id(recording.raised.layer)] = f"its capture failed: {why}"
                log.warning("CUDA graphs: layer %s could not be captured (%s); it runs between the graphs",
                            recording.raised.name, why)
            return False
        finally:
            self.net.tape = None
            recording.abandon()
        self.recording = recording
        self.layouts = {id(step): [(blob, blob.layout()) for blob in step.owner.tops]
                        for step in recording.entries + recording.inputs
                        if step.__class__ is _Step and step.kind == "input"}
        return True

    def _work(self):
        """The iteration as the solver runs it, up to and including the update."""
        solver = self.solver
        loss = solver.iteration_passes(fetch=False)
        solver.gradients_ready()
        if solver.applies_update:
            self.net.run_step(None, solver.update_parameters, 0.0, self.scalars)
        return loss

    def _scalar_values(self, rate):
        rate, grad_scale, weight_decay, own = self.solver.fused_arguments(rate)
        return numpy.array([rate, grad_scale, weight_decay, *own], dtype=numpy.float32)

    def _upload_scalars(self):
        self.scalars.set(self._scalar_values(self.solver.get_learning_rate()))

    def _state(self):
        """What an iteration writes: (name, device array) of the compared ones, and the other device arrays: the
        net's blobs, the layers' own (BatchNorm's statistics, where they are not learnables) and their random
        generators' state, so that both halves of the self-check draw the same masks and training draws what
        it would."""
        flat = self.solver.flat
        compared = [("the parameters", flat.data), ("the gradients", flat.diff)]
        compared += [(f"history {k}", h) for k, h in enumerate(flat.history)]
        blobs = [record.blob for record in self.net.blob_records]
        blobs += [blob for layer in self.net.layers for blob in layer.blobs]
        written = [array for blob in blobs for array in (blob.data, blob.diff)]
        written += [array for layer in self.net.layers for array in layer.random_state()]
        return compared, written

    @staticmethod
    def _results(loss, compared):
        """The loss and the compared arrays, on the host."""
        return [numpy.asarray(loss if isinstance(loss, float) else loss.get())] + [a.get() for _, a in compared]

    # ------------------------------------------------------------ replay

    def _replay(self, fetch, checking=False):
        """Runs the iteration from its graphs and steps; `checking`: the self-check's (no input, no hooks)."""
        self._upload_scalars()
        if not checking:
            for step in self.recording.inputs:
                step.run()
            moved = self._moved(self.recording.inputs)
            if moved is not None:
                self.recording = None
                self._turn_off(f"input layer {moved} changed the shape or storage of a top blob")
                # its batch is in place: this iteration runs eagerly without the input layers
                self.net.tape = self._eager_tape = _Eager(with_hooks=True, failed=self.failed)
                return None
        stream = self.net.xp.cuda.get_current_stream()
        for entry in self.recording.entries:
            if entry.__class__ is not _Step:
                entry.launch(stream)
            elif entry.kind == "input":
                if not checking:
                    entry.run()
                    if self._moved([entry]) is not None:
                        raise RuntimeError(f"input layer {entry.owner.name} changed the shape of a top blob in the "
                                           f"middle of a replayed iteration (iter_size > 1); run with SCAFFE_CAPTURE=0")
            elif not (checking and entry.kind == "host"):
                entry.run()
        loss = self.loss if isinstance(self.loss, float) else self.loss.copy()
        return self.solver.check_loss(loss) if fetch else loss

    def _moved(self, steps):
        """The name of the first of these input steps' layers that moved or reshaped a top blob, or None."""
        for step in steps:
            for blob, (data, diff, shape) in self.layouts[id(step)]:
                now = blob.layout()
                if now[0] is not data or now[1] is not diff or now[2] != shape:
                    return step.owner.name
        return None


def _put_back(arrays, saved):
    for array, values in zip(arrays, saved):
        array[...] = values


def _difference(names, eager, replayed):
    """None, or what differs between an eager and a replayed iteration's results, beyond TOLERANCE."""
    for name, a, b in zip(names, eager, replayed):
        scale = float(numpy.max(numpy.abs(a))) if a.size else 0.0
        gap = numpy.abs(a.astype(numpy.float64) - b)
        if not numpy.all(gap <= TOLERANCE * scale):
            largest = float(numpy.nanmax(gap)) if numpy.isfinite(gap).any() else float("nan")
            return (f"a replayed iteration differs from an eager one in {name} by up to {largest:.3g} "
                    f"(largest magnitude {scale:.3g})")
    return None
