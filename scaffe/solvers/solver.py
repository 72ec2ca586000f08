"""Solver: Caffe's training loop (test, forward/backward, display, update, snapshot, restore).

Each iteration follows BVLC Caffe's Solver::Step exactly, because users compare loss curves and
saved weights with Caffe's: (test) -> clear gradients -> forward/backward iter_size times ->
display -> callbacks -> update -> snapshot/stop requests. The update and its history belong to
SGDSolver (scaffe.solvers.sgd), which every solver type derives from, as in Caffe. On a GPU the
iteration's device work is replayed from CUDA graphs once it has run eagerly (scaffe.capture).
"""
import math
import os
import time

import numpy
from google.protobuf import text_format

from scaffe import io as sio
from scaffe.io import copy_message, to_host
from scaffe.log import fmt, get_logger, output_line
from scaffe.capture import CapturedIteration
from scaffe.net import HOST, Net, NetError
from scaffe.proto import caffe_pb2
from scaffe.solvers.signals import SNAPSHOT, STOP, as_requests

log = get_logger(__name__)


class SolverError(RuntimeError):
    """Training cannot go on (bad solver settings, NaN loss, unreadable snapshot); one line."""


class Solver:
    """Base of all solvers. Build with `create_solver(param)` or `solver_from_file(path)` (scaffe.solvers).

    Hooks for a distributed trainer and for loggers, like Caffe's Solver::Callback: `callbacks`
    holds `SolverCallback`s (scaffe.solvers.callbacks), called in their order.
    `action_function` (a callable returning "none", "stop", "snapshot" or a set of them) is polled
    once per iteration and per test batch. A distributed schedule sets `agreement`, an object whose
    `agreed_requests()` gives the requests every rank acts on at the end of this iteration (it
    polls `local_requests()` itself); the solver then never polls on its own. `test_sharding`
    (see scaffe.parallel.sharded_testing), when set, deals the test batches out to all ranks.
    A schedule that updates the parameters itself (the scaffe schedule's root, blob by blob, for
    every rank) sets `applies_update` False: apply_update then only accounts for the rate; one that keeps
    the solver's history on another rank (the scaffe schedule's non-root ranks) sets `holds_history` False.

    Non-root solvers (`root_solver=False`) neither display nor snapshot, like Caffe's worker
    solvers; the root does those for everyone. They test only when testing is sharded.
    """

    type = None

    def __init__(self, param, *, source=None, train_net=None, test_nets=None, root_solver=True,
                 rank=0, net_kwargs=None):
        self.param = caffe_pb2.SolverParameter()
        self.param.CopyFrom(param)
        self.source = os.fspath(source) if source is not None else None
        self.root_solver = root_solver
        self.rank = rank
        self.net_kwargs = dict(net_kwargs or {})
        self.callbacks = []
        self.action_function = None
        self.agreement = None
        self.test_sharding = None
        self.requested_early_exit = False
        self._snapshot_iter = None
        self._solve_start = None
        self.iter = 0
        self.current_step = 0
        self.losses = []
        self.smoothed_loss = 0.0
        self.last_rate = None
        self.applies_update = True
        self.holds_history = True
        self.capture = None  # the scaffe.capture.CapturedIteration, made by the first step()
        self._passes_loss = 0.0
        self.flat = None  # the learnables' flat buffers (scaffe.solvers.flat) where the solver keeps them
        if root_solver:
            log.info("Initializing solver from parameters: \n%s", text_format.MessageToString(self.param))
        if self.param.average_loss < 1:
            raise SolverError(f"{self._where()}average_loss must be >= 1, got {self.param.average_loss}")
        if self.param.iter_size < 1:
            raise SolverError(f"{self._where()}iter_size must be >= 1, got {self.param.iter_size}")
        self._check_snapshot_prefix()
        if self.param.random_seed >= 0:
            seed_random(self.param.random_seed + rank)
        self.net = train_net if train_net is not None else self._init_train_net()
        self.test_nets = list(test_nets) if test_nets is not None else self._init_test_nets()
        if root_solver:
            log.info("Solver scaffolding done.")

    def _where(self):
        return f"{self.source}: " if self.source else ""

    # ------------------------------------------------------------ building the nets

    def _resolve(self, path):
        """A path from the solver file: as given (Caffe: relative to the working directory), else
        relative to the solver file's folder, which is what people usually mean."""
        if os.path.exists(path) or not self.source:
            return path
        alt = os.path.join(os.path.dirname(os.path.abspath(self.source)), path)
        return alt if os.path.exists(alt) else path

    def _read_net(self, path):
        try:
            return sio.read_net_prototxt(self._resolve(path))
        except sio.CaffeFormatError as e:
            raise SolverError(f"{self._where()}net: {e}") from None

    def _init_train_net(self):
        p = self.param
        given = [f for f in ("net", "net_param", "train_net", "train_net_param") if p.HasField(f)]
        if len(given) != 1:
            raise SolverError(f"{self._where()}the solver must name exactly one train net with one of net, "
                              f"net_param, train_net, train_net_param; found {len(given) or 'none'}"
                              + (f" ({', '.join(given)})" if given else ""))
        field = given[0]
        if field.endswith("_param"):
            if self.root_solver:
                log.info("Creating training net specified in %s.", field)
            net_param = caffe_pb2.NetParameter()
            net_param.CopyFrom(getattr(p, field))
            source = f"{self.source or '<solver>'} ({field})"
        else:
            path = getattr(p, field)
            if self.root_solver:
                log.info("Creating training net from %s file: %s", "net" if field == "net" else "train_net", path)
            net_param = self._read_net(path)
            source = self._resolve(path)
        # Solver defaults first, then the net's own state, then train_state, as Caffe merges them.
        state = caffe_pb2.NetState(phase=caffe_pb2.TRAIN)
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net_param.state.CopyFrom(state)
        net = Net(net_param, source=source, **self.net_kwargs)
        load_weights(net, p.weights)
        return net

    def _init_test_nets(self):
        self._check_test_settings()
        nets = []
        for i, (net_param, what, source) in enumerate(self._test_net_params()):
            state = caffe_pb2.NetState(phase=caffe_pb2.TEST)
            state.MergeFrom(net_param.state)
            if len(self.param.test_state):
                state.MergeFrom(self.param.test_state[i])
            net_param.state.CopyFrom(state)
            if self.root_solver:
                log.info("Creating test net (#%d) specified by %s", i, what)
            net = Net(net_param, source=source, **self.net_kwargs)
            load_weights(net, self.param.weights)
            nets.append(net)
        return nets

    def _check_test_settings(self):
        p = self.param
        generic = p.HasField("net") + p.HasField("net_param")
        if generic > 1:
            raise SolverError(f"{self._where()}give either net or net_param, not both")
        explicit = len(p.test_net_param) + len(p.test_net)
        if generic:
            if len(p.test_iter) < explicit:
                raise SolverError(f"{self._where()}test_iter must be given for each test net")
        elif len(p.test_iter) != explicit:
            raise SolverError(f"{self._where()}test_iter must be given once per test net "
                              f"({explicit} test nets, {len(p.test_iter)} test_iter)")
        instances = explicit + (len(p.test_iter) - explicit)
        if len(p.test_state) and len(p.test_state) != instances:
            raise SolverError(f"{self._where()}test_state must be left out or given once per test net ({instances})")
        if instances and p.test_interval <= 0:
            raise SolverError(f"{self._where()}test_iter is given, so test_interval must be > 0")

    def _test_net_params(self):
        """(NetParameter, how the log names it, source) per test net: test_net_param, test_net,
        then the generic net for the test_iter left over, as Caffe's InitTestNets orders them."""
        p = self.param
        params = []
        for tp in p.test_net_param:
            params.append((copy_message(tp), "test_net_param", f"{self.source or '<solver>'} (test_net_param)"))
        for path in p.test_net:
            params.append((self._read_net(path), f"test_net file: {path}", self._resolve(path)))
        for _ in range(len(p.test_iter) - len(params)):
            if p.HasField("net_param"):
                params.append((copy_message(p.net_param), "net_param", f"{self.source or '<solver>'} (net_param)"))
            else:
                params.append((self._read_net(p.net), f"net file: {p.net}", self._resolve(p.net)))
        return params

    def _check_snapshot_prefix(self):
        if not (self.root_solver and self.param.snapshot):
            return
        folder = os.path.dirname(self.param.snapshot_prefix) or "."
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise SolverError(f"{self._where()}cannot write to snapshot prefix '{self.param.snapshot_prefix}': "
                              f"make sure that the folder '{folder}' exists and is writable")

    # ------------------------------------------------------------ the loop

    def local_requests(self):
        """The requests (a frozenset of "stop", "snapshot") made to this process since the last poll."""
        return as_requests(self.action_function()) if self.action_function is not None else frozenset()

    def _requests(self):
        return self.agreement.agreed_requests() if self.agreement is not None else self.local_requests()

    def solve(self, resume_file=None):
        """Caffe's Solver::Solve: train until max_iter, snapshot, then a last forward and test."""
        log.info("Solving %s", self.net.name)
        log.info("Learning Rate Policy: %s", self.param.lr_policy)
        self.requested_early_exit = False
        if resume_file:
            log.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        start_iter = self.iter
        self._solve_start = time.perf_counter()
        self.step(self.param.max_iter - self.iter)
        if self.root_solver and self.param.snapshot_after_train and self._snapshot_iter != self.iter and (
                not self.param.snapshot or self.iter % self.param.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:
            log.info("Optimization stopped early.")
            return
        if self._display_due():
            loss = self.net.forward()
            self._update_smoothed_loss(loss, start_iter)
            if self.root_solver:
                log.info("Iteration %d, loss = %s", self.iter, fmt(self.smoothed_loss))
        if self.param.test_interval and self.iter % self.param.test_interval == 0:
            self.test_all()
        log.info("Optimization Done.")

    def step(self, iters):
        """Runs `iters` iterations (Caffe's Solver::Step)."""
        start_iter = self.iter
        stop_iter = self.iter + iters
        self.losses = []
        self.smoothed_loss = 0.0
        if self._solve_start is None:
            self._solve_start = time.perf_counter()
        self._display_timer, self._display_iter = time.perf_counter(), self.iter
        if self.capture is None:
            self.capture = CapturedIteration(self)
        while self.iter < stop_iter:
            if self._test_due():
                self.test_all()
                if self.requested_early_exit:
                    break
            iter_start = time.perf_counter()
            fetch = self._display_due() or self.iter + 1 == stop_iter
            replayed = self.capture.run(fetch)
            loss = self.iteration_passes(fetch) if replayed is None else replayed
            self._update_smoothed_loss(loss, start_iter)
            if self.root_solver and self._display_due():
                self._display()
            if replayed is None:
                self.gradients_ready()
                self.apply_update()
            else:
                self.account_rate()  # the graph applied it
            self.iter += 1  # iter counts the updates applied so far
            self._report_iteration(loss, iter_start)
            if self._snapshot_or_stop():
                break
        self.parameters_read()  # whoever calls step next (pycaffe, solve) reads them

    def _test_due(self):
        p = self.param
        return p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization)

    def _display_due(self):
        return bool(self.param.display) and self.iter % self.param.display == 0

    def iteration_passes(self, fetch=True):
        """An iteration up to its gradients: they are cleared, the callbacks told, then the passes run;
        returns their mean loss. Every part is a step of the net's (Net.run_step), as a captured
        iteration (scaffe.capture) records it, followed by gradients_ready() and the update."""
        self.net.run_step(None, self.clear_param_diffs)
        for cb in self.callbacks:
            self.net.run_step(HOST, cb.on_start)
        return self._forward_backward_passes(fetch)

    def gradients_ready(self):
        for cb in self.callbacks:
            self.net.run_step(HOST, cb.on_gradients_ready)

    def _forward_backward_passes(self, fetch=True):
        """iter_size forward/backward passes, their gradients summed; returns their mean loss.

        A loss on the GPU stays there (fetching it is a host sync) and is checked only when `fetch`
        (display iterations and the last one): a NaN loss means NaN weights, so it is still NaN then."""
        self._passes_loss = 0.0
        for _ in range(self.param.iter_size):
            self.net.run_step(None, self._add_pass_loss, self.forward_backward())
        if self.param.iter_size != 1:
            self.net.run_step(None, self._average_pass_loss)
        loss = self._passes_loss
        return self.check_loss(loss) if fetch or isinstance(loss, float) else loss

    def _add_pass_loss(self, value):
        # On the device each operation is a launch: none to add the first pass's loss to 0 or divide by 1.
        loss = self._passes_loss
        self._passes_loss = value if isinstance(loss, float) and not isinstance(value, float) else loss + value

    def _average_pass_loss(self):
        self._passes_loss = self._passes_loss / self.param.iter_size

    def check_loss(self, loss):
        """`loss`, fetched and checked (with the errors the layers kept on the device): a host sync."""
        self.net.check_deferred_errors()
        if not math.isfinite(float(loss)):
            raise SolverError(f"{self._where()}iteration {self.iter}: the loss is {loss} "
                              f"(diverged); lower base_lr or check the data and the net")
        return loss

    def _display(self):
        lapse = time.perf_counter() - self._display_timer
        per_s = (self.iter - self._display_iter) / (lapse if lapse else 1.0)
        log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter, fmt(per_s),
                 fmt(lapse), self.param.display, fmt(self.smoothed_loss))
        self._display_timer, self._display_iter = time.perf_counter(), self.iter
        self._log_outputs(self.net, "Train net output")

    def _report_iteration(self, loss, iter_start):
        """Gives the callbacks the record of the iteration just finished."""
        elapsed = time.perf_counter() - iter_start
        batch = self.net.batch_size * self.param.iter_size
        record = {"iteration": self.iter - 1, "seconds": time.perf_counter() - self._solve_start,
                  "loss": loss, "smoothed_loss": self.smoothed_loss, "lr": self.last_rate,
                  "images_per_s": batch / elapsed if elapsed > 0 else float("inf")}
        for cb in self.callbacks:
            cb.on_iteration(record)

    def _snapshot_or_stop(self):
        """Snapshots when due or requested; True when a stop was requested."""
        requests = self._requests()
        if self.root_solver and ((self.param.snapshot and self.iter % self.param.snapshot == 0)
                                 or SNAPSHOT in requests):
            self.snapshot()
        if STOP in requests:
            self.requested_early_exit = True
            return True
        return False

    def clear_param_diffs(self):
        """Zero every learnable blob's gradient before an iteration's passes."""
        self.net.clear_param_diffs()

    def forward_backward(self):
        """One forward and backward pass of the training net; returns its loss. A distributed
        trainer may override this (or hook the net) to overlap communication with it."""
        return self.net.forward_backward()

    def close(self):
        """Stops the data readers of the training and test nets."""
        for net in [self.net] + list(self.test_nets):
            net.close()

    def _update_smoothed_loss(self, loss, start_iter):
        average_loss = self.param.average_loss
        if len(self.losses) < average_loss:
            self.losses.append(loss)
            size = len(self.losses)
            self.smoothed_loss = (self.smoothed_loss * (size - 1) + loss) / size
        else:
            idx = (self.iter - start_iter) % average_loss
            self.smoothed_loss += (loss - self.losses[idx]) / average_loss
            self.losses[idx] = loss

    def _log_outputs(self, net, title):
        index = 0
        for blob_id in net.output_blob_ids:
            name = net.blob_names[blob_id]
            weight = net.blob_loss_weights[blob_id]
            values = numpy.asarray(to_host(net.blobs_list[blob_id].data)).ravel()
            for v in values:
                log.info("    %s #%d: %s", title, index, output_line(name, v, weight))
                index += 1

    # ------------------------------------------------------------ testing

    def parameters_read(self):
        """The parameters are about to be read between iterations: every update still in flight lands."""
        for cb in self.callbacks:
            cb.on_parameters_read()

    def test_all(self):
        if self.test_sharding is None and not self.root_solver:
            return
        self.parameters_read()
        if self.test_sharding is not None:
            for cb in self.callbacks:
                cb.on_test_start()
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(i)

    def test(self, test_net_id=0):
        """Caffe's Solver::Test: mean of every test net output over test_iter batches.

        With `test_sharding` every rank runs its share of the batches and the root sums the
        per-batch outputs in batch order, so it reports the numbers one process would. Requests
        are then left for the next iteration's agreement: breaking off on one rank would leave
        the others waiting for it."""
        if self.root_solver:
            log.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        net = self.test_nets[test_net_id]
        net.share_trained_layers_with(self.net)
        iterations = self.param.test_iter[test_net_id]
        if iterations <= 0:
            raise SolverError(f"{self._where()}test_iter for test net #{test_net_id} must be > 0, got {iterations}")
        sharding = self.test_sharding
        batches = range(iterations) if sharding is None else sharding.batches(test_net_id, iterations)
        rows = self._test_batches(net, batches)
        if rows is not None and sharding is not None:
            rows = sharding.gather(batches, rows)  # None but on the root: it reports for everyone
        return None if rows is None else self._report_test(net, test_net_id, rows)

    def _test_batches(self, net, batches):
        """Per batch: its loss, then every output value; None when a stop request broke the test off."""
        rows = []
        for _ in batches:
            if self.agreement is None:
                requests = self.local_requests()
                if SNAPSHOT in requests:
                    self.snapshot()
                if STOP in requests:
                    self.requested_early_exit = True
                    log.info("Test interrupted.")
                    return None
            iter_loss = float(net.forward())
            rows.append(numpy.concatenate([[iter_loss]] + [numpy.asarray(to_host(b.data), dtype=numpy.float64).ravel()
                                                           for b in net.output_blobs]))
        return rows

    def _report_test(self, net, test_net_id, rows):
        """Logs the mean of each output over the batches' `rows` and passes them to the callbacks."""
        iterations = self.param.test_iter[test_net_id]
        scores = rows[0][1:].copy()
        loss = rows[0][0]
        for row in rows[1:]:
            scores += row[1:]
            loss += row[0]
        if self.param.test_compute_loss:
            log.info("Test loss: %s", fmt(loss / iterations))
        results = {}
        owners = [blob_id for blob_id in net.output_blob_ids for _ in range(net.blobs_list[blob_id].count)]
        for index, (blob_id, key, total) in enumerate(zip(owners, test_output_keys(net), scores)):
            name = net.blob_names[blob_id]
            weight = net.blob_loss_weights[blob_id]
            mean = float(numpy.float32(total / iterations))
            log.info("    Test net output #%d: %s", index, output_line(name, mean, weight))
            results[key] = mean
        for cb in self.callbacks:
            cb.on_test(self.iter, test_net_id, results)
        return results

    # ------------------------------------------------------------ snapshots

    def snapshot_filename(self, extension):
        return f"{self.param.snapshot_prefix}_iter_{self.iter}{extension}"

    def snapshot(self):
        """Writes <prefix>_iter_<N>.caffemodel(.h5) and .solverstate(.h5), each atomically."""
        self.parameters_read()
        self._snapshot_iter = self.iter
        if self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            model_filename = self.snapshot_filename(".caffemodel.h5")
            log.info("Snapshotting to HDF5 file %s", model_filename)
            self.net.save_hdf5(model_filename, self.param.snapshot_diff)
        else:
            model_filename = self.snapshot_filename(".caffemodel")
            log.info("Snapshotting to binary proto file %s", model_filename)
            self.net.save(model_filename, self.param.snapshot_diff)
        self.snapshot_solver_state(model_filename)
        return model_filename

    def snapshot_solver_state(self, model_filename):
        """Writes the .solverstate(.h5) that goes with `model_filename`; returns its name."""
        raise NotImplementedError(f"solver type {self.type} has no solver state")

    def restore_solver_state(self, state, state_file):
        """Takes what the update needs (current_step, history) from SolverState `state`."""
        raise NotImplementedError(f"solver type {self.type} has no solver state")

    def restore(self, state_file, model=None):
        """Restores iteration, weights (from the state's learned_net, or from `model` where given) and history.
        As in Caffe, the position in the training data is not restored: data layers start from their
        beginning (scaffe.elastic's commits keep it)."""
        state_file = os.fspath(state_file)
        if not os.path.exists(state_file):
            raise SolverError(f"{state_file}: no such solver state file")
        try:
            state = sio.read_solverstate(state_file)
        except sio.CaffeFormatError as e:
            raise SolverError(str(e)) from None
        model = self._learned_net(state, state_file) if model is None else model
        if model is not None:
            try:
                self.net.copy_trained_layers_from(model)
            except NetError as e:
                raise SolverError(f"{state_file}: learned_net: {e}") from None
        self.iter = int(state.iter)
        self.restore_solver_state(state, state_file)

    def _learned_net(self, state, state_file):
        """The weights file that goes with SolverState `state`, or None when it names none and the solver's
        `weights` are loaded already. Without either, resuming would train on from filler values, so that
        is refused (Caffe: "File not found")."""
        model = state.learned_net
        if model and not os.path.exists(model):
            # Caffe resolves it from the working directory; try the state file's folder too.
            alt = os.path.join(os.path.dirname(os.path.abspath(state_file)), os.path.basename(model))
            model = alt if os.path.exists(alt) else model
        if model and os.path.exists(model):
            return model
        problem = f"learned_net {model!r}: no such file" if model else "names no learned_net"
        if len(self.param.weights):
            log.warning("%s %s; the weights given to the solver stand", state_file, problem)
            return None
        raise SolverError(f"{state_file}: {problem}, so there are no weights to resume from; give the "
                          ".caffemodel snapshotted with it")


def test_output_keys(net):
    """Names for a net's output values: the blob name, or name_<k> per element of a multi-value output."""
    keys = []
    for blob_id in net.output_blob_ids:
        name = net.blob_names[blob_id]
        count = net.blobs_list[blob_id].count
        keys.extend([name] if count == 1 else [f"{name}_{k}" for k in range(count)])
    return keys


def seed_random(seed):
    """Seeds the generators scaffe draws from (fillers, Dropout, shuffling): numpy's global one."""
    import random
    numpy.random.seed(int(seed) % (2 ** 32))
    random.seed(int(seed))


def load_weights(net, weights):
    """Caffe's LoadNetWeights for a comma-separated list of .caffemodel(.h5) files, or for each entry of
    a solver's `weights`: the files are loaded in order, a later one overwriting the layers it holds."""
    entries = [weights] if isinstance(weights, str) else weights
    paths = [path.strip() for entry in entries for path in entry.split(",") if path.strip()]
    for path in paths:
        log.info("Finetuning from %s", path)
    if paths:
        net.copy_trained_layers_from(*paths)


def read_solver_file(path):
    """A SolverParameter from prototxt, with Caffe's snapshot_prefix upgrade: no prefix means the
    solver file's path without extension; a prefix that is a folder gets the file's stem added."""
    path = os.fspath(path)
    try:
        param = sio.read_solver_prototxt(path)
    except sio.CaffeFormatError as e:
        raise SolverError(str(e)) from None
    stem = os.path.splitext(path)[0]
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = stem
        log.info("snapshot_prefix was not specified and is set to %s", stem)
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, os.path.basename(stem))
        log.info("snapshot_prefix is a directory and is replaced to %s", param.snapshot_prefix)
    return param
