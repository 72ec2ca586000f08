"""pycaffe's Python interface (`caffe.Net`, `caffe.get_solver`, `caffe.set_mode_gpu` ...) over scaffe's Net and Solver.

Scripts written for BVLC Caffe's `import caffe` run with `import scaffe as caffe` as far as they use
what is here. Differences from pycaffe: `Net`'s phase defaults to TEST; in GPU mode `.data` and `.diff`
are cupy arrays on the device (pycaffe copies to the host); errors are Python exceptions with one line.
"""
import collections
import itertools
import os
import sys

import numpy

from scaffe import io as sio
from scaffe.blob_view import BlobView
from scaffe.closing import Closing
from scaffe.layer_impls import known_types
from scaffe.log import get_logger, setup_logging
from scaffe.net import Net as _CoreNet
from scaffe.proto import caffe_pb2
from scaffe.solvers import read_solver_file, seed_random, solver_class
from scaffe.solvers.callbacks import SolverCallback
from scaffe.timer import Timer as _Timer

__all__ = ["TRAIN", "TEST", "Net", "BlobView", "Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver",
           "RMSPropSolver", "AdaDeltaSolver", "AdamSolver", "get_solver", "set_mode_cpu", "set_mode_gpu",
           "set_device", "set_random_seed", "layer_type_list", "has_nccl",
           "solver_count", "solver_rank", "set_solver_count", "set_solver_rank", "set_multiprocess",
           "Timer", "init_log", "log"]

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST

# ---------------------------------------------------------------- process-wide mode (Caffe::mode())

_mode = {"gpu": False, "device": 0}


def _usable_cupy(call):
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        raise RuntimeError(f"{call}: no CUDA GPU is usable here (cupy missing or no device); "
                           f"stay in CPU mode (scaffe.set_mode_cpu())")
    return cupy


def set_mode_cpu():
    """Nets and solvers made from now on compute with numpy."""
    _mode["gpu"] = False


def set_mode_gpu():
    """Nets and solvers made from now on compute with cupy on the device of `set_device` (default 0)."""
    _usable_cupy("set_mode_gpu()")
    _mode["gpu"] = True


def set_device(device_id):
    """The GPU that nets made in GPU mode use (Caffe::SetDevice)."""
    cupy = _usable_cupy(f"set_device({device_id})")
    count = cupy.cuda.runtime.getDeviceCount()
    if not 0 <= int(device_id) < count:
        raise ValueError(f"set_device({device_id}): no such device ({count} GPU(s) here, ids 0..{count - 1})")
    _mode["device"] = int(device_id)


def _array_module():
    if not _mode["gpu"]:
        return numpy
    cupy = _usable_cupy("GPU mode")
    cupy.cuda.Device(_mode["device"]).use()
    return cupy


def set_random_seed(seed):
    """Seeds fillers, Dropout and data shuffling (as a solver's random_seed does)."""
    seed_random(seed)


def layer_type_list():
    """The layer type names a net may use."""
    return known_types()


def has_nccl():
    """False: scaffe has no NCCL (so no `caffe.NCCL`). Its data-parallel training reduces gradients
    over MPI with its own hierarchical collectives, one process per device (`mpiexec -n N scaffe train`)."""
    return False


# Caffe::solver_count()/solver_rank(), which Python layers read to take their share of the data in
# multi-GPU training; here one training process per device: the MPI job, unless set explicitly.
_solvers = {"count": None, "rank": None}


def _mpi_world():
    """(rank, size) of MPI.COMM_WORLD once MPI has started in this process (scaffe train starts it
    before building nets), else (0, 1); never starts MPI itself."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return 0, 1
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def solver_count():
    """How many processes train together: the MPI job's size (1 without MPI), or set_solver_count's."""
    return _solvers["count"] if _solvers["count"] is not None else _mpi_world()[1]


def solver_rank():
    """This training process's rank among solver_count(): its MPI rank, or set_solver_rank's."""
    return _solvers["rank"] if _solvers["rank"] is not None else _mpi_world()[0]


def set_solver_count(count):
    _solvers["count"] = int(count)


def set_solver_rank(rank):
    _solvers["rank"] = int(rank)


def set_multiprocess(multiprocess):
    """Accepted and changes nothing: Caffe needs it for Python layers in multi-process training (its
    python/train.py), scaffe's Python layers train in every process of `mpiexec -n N scaffe train` without it."""
    if not isinstance(multiprocess, (int, numpy.integer, numpy.bool_)):  # bool is an int, as for Caffe's binding
        raise TypeError(f"set_multiprocess() takes True or False, got {multiprocess!r}")


# ---------------------------------------------------------------- logging and timing

def init_log(level=None, stderr=None):
    """Starts logging as pycaffe's init_log(), init_log(level), init_log(level, stderr): messages of glog
    severity `level` (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL) and above, `stderr` setting glog's logtostderr;
    left out, GLOG_minloglevel and GLOG_logtostderr decide. Unlike glog without logtostderr, the messages
    go to stderr too (and to log files only where GLOG_log_dir names a folder), as in scaffe's commands."""
    flags = {}
    if level is not None:
        flags["minloglevel"] = str(int(level))
    if stderr is not None:
        flags["logtostderr"] = "true" if stderr else "false"
    setup_logging(flags)


def log(message):
    """Logs `message` at INFO, as Caffe's LOG(INFO) (pycaffe's caffe.log)."""
    get_logger().info("%s", message)


class Timer(_Timer):
    """pycaffe's caffe.Timer: `start()`, `stop()`, `ms`; made in GPU mode, it times the device's work."""

    def __init__(self):
        super().__init__(_array_module())


# ---------------------------------------------------------------- nets

def _callable(function, what):
    """`function`, checked now rather than where training first calls it."""
    if not callable(function):
        raise TypeError(f"{what} must be callable, got {function!r}")
    return function


def _net_arguments(args, weights, phase):
    """pycaffe's positional forms: Net(file, phase) and Net(file, weights, phase); Net(file, weights) too."""
    if len(args) > 2:
        raise TypeError(f"Net() takes the network file and at most 2 positional arguments (weights, phase), "
                        f"got {len(args)}")
    if len(args) == 2:
        given_weights, given_phase = args
    elif len(args) == 1 and isinstance(args[0], (str, os.PathLike)):
        given_weights, given_phase = args[0], None
    elif len(args) == 1:
        given_weights, given_phase = None, args[0]
    else:
        given_weights, given_phase = None, None
    for name, positional, keyword in (("weights", given_weights, weights), ("phase", given_phase, phase)):
        if positional is not None and keyword is not None:
            raise TypeError(f"Net() got {name} both as a positional and as a keyword argument")
    weights = given_weights if weights is None else weights
    phase = given_phase if phase is None else phase
    return weights, TEST if phase is None else phase


class Net(Closing):
    """A net made from a prototxt file, with pycaffe's interface.

    `Net(network_file, phase)`, `Net(network_file, weights, phase)` or
    `Net(network_file, weights=None, phase=TEST, level=0, stages=None)`; `phase` is scaffe.TRAIN or
    scaffe.TEST (or "TRAIN"/"TEST"). It computes on numpy, or on cupy after `set_mode_gpu()`.
    """

    def __init__(self, network_file, *args, weights=None, phase=None, level=0, stages=None):
        weights, phase = _net_arguments(args, weights, phase)
        self._net = _CoreNet.from_file(network_file, phase, list(stages or []), level, xp=_array_module())
        if weights is not None:
            self._net.copy_trained_layers_from(weights)

    @classmethod
    def _wrap(cls, core_net):
        """The pycaffe view of a net that scaffe built (a solver's train or test net)."""
        view = cls.__new__(cls)
        view._net = core_net
        return view

    # ------------------------------------------------------------ what the net holds

    @property
    def blobs(self):
        """OrderedDict of blob name -> BlobView, in net order (input to output)."""
        core = self._net
        return collections.OrderedDict((name, BlobView(blob)) for name, blob in zip(core.blob_names, core.blobs_list))

    @property
    def params(self):
        """OrderedDict of layer name -> [BlobView of each parameter blob] for layers that have parameters."""
        return collections.OrderedDict((name, [BlobView(b) for b in layer.blobs])
                                       for name, layer in zip(self._net.layer_names, self._net.layers) if layer.blobs)

    @property
    def layers(self):
        """The layers in net order; a Python layer appears as the user's own object, as in pycaffe."""
        return [getattr(layer, "python_layer", layer) for layer in self._net.layers]

    @property
    def _layer_names(self):
        return list(self._net.layer_names)

    @property
    def _blob_names(self):
        return list(self._net.blob_names)

    @property
    def layer_dict(self):
        return collections.OrderedDict(zip(self._net.layer_names, self.layers))

    @property
    def inputs(self):
        """Names of the blobs that Input layers fill (what forward(**inputs) takes)."""
        return [self._net.blob_names[i] for i in self._net.input_blob_ids]

    @property
    def outputs(self):
        """Names of the blobs no layer consumes, in Caffe's order."""
        return list(self._net.output_names)

    @property
    def top_names(self):
        core = self._net
        return collections.OrderedDict((name, [core.blob_names[i] for i in ids])
                                       for name, ids in zip(core.layer_names, core.top_id_vecs))

    @property
    def bottom_names(self):
        core = self._net
        return collections.OrderedDict((name, [core.blob_names[i] for i in ids])
                                       for name, ids in zip(core.layer_names, core.bottom_id_vecs))

    @property
    def blob_loss_weights(self):
        return collections.OrderedDict(zip(self._net.blob_names, self._net.blob_loss_weights))

    # ------------------------------------------------------------ running

    def _layer_index(self, name, what):
        try:
            return self._net.layer_names_index[name]
        except KeyError:
            raise ValueError(f"{what}={name!r}: no layer of that name in {self._net.source}") from None

    def _blob_list(self, names, what):
        unknown = [n for n in names if n not in self._net.blobs]
        if unknown:
            raise ValueError(f"{what}: no blob named {', '.join(map(repr, unknown))} in {self._net.source}")
        return list(names)

    def _fill(self, arrays, expected, field, what):
        """Copies {blob name: array} into the blobs' data or diff, as pycaffe's forward/backward do."""
        if set(arrays) != set(expected):
            raise ValueError(f"{what}: got arrays for {sorted(arrays)}, the net needs exactly {sorted(expected)}")
        for name, array in arrays.items():
            blob = self._net.blobs[name]
            target = getattr(blob, field)
            if numpy.ndim(array) < 1 or numpy.shape(array)[0] != blob.shape[0]:
                raise ValueError(f"{what}: {name} has shape {numpy.shape(array)}, the blob holds a batch of "
                                 f"{blob.shape[0]} ({blob.shape}); reshape the blob and call net.reshape() first")
            try:
                target[...] = blob.xp.asarray(array)
            except ValueError:
                raise ValueError(f"{what}: {name} has shape {numpy.shape(array)}, the blob has shape {blob.shape}; "
                                 f"reshape the blob and call net.reshape() first") from None

    def forward(self, blobs=None, start=None, end=None, **inputs):
        """Runs layers `start`..`end` (names, inclusive; default all) after copying `inputs` (blob name ->
        array, all of net.inputs) in; returns {name: data array} of the outputs (of `end`'s tops when
        `end` is given) and of the extra `blobs` named."""
        extra = self._blob_list(blobs or [], "forward(blobs=...)")
        start_id = 0 if start is None else self._layer_index(start, "start")
        if end is None:
            end_id, wanted = len(self._net.layers) - 1, self.outputs + extra
        else:
            end_id = self._layer_index(end, "end")
            wanted = self.top_names[end] + extra
        if inputs:
            self._fill(inputs, self.inputs, "data", "forward()")
        self._net.forward(start_id, end_id)
        return {name: self._net.blobs[name].data for name in dict.fromkeys(wanted)}

    def backward(self, diffs=None, start=None, end=None, **top_diffs):
        """Runs layers `start` down to `end` backward after copying `top_diffs` (output blob name -> array,
        all of net.outputs) into the outputs' diffs; returns {name: diff array} of the inputs (of `end`'s
        bottoms when `end` is given) and of the extra `diffs` named."""
        extra = self._blob_list(diffs or [], "backward(diffs=...)")
        start_id = len(self._net.layers) - 1 if start is None else self._layer_index(start, "start")
        if end is None:
            end_id, wanted = 0, self.inputs + extra
        else:
            end_id = self._layer_index(end, "end")
            wanted = self.bottom_names[end] + extra
        if top_diffs:
            self._fill(top_diffs, self.outputs, "diff", "backward()")
        self._net.backward_from_to(start_id, end_id)
        return {name: self._net.blobs[name].diff for name in dict.fromkeys(wanted)}

    def reshape(self):
        """Propagates new input shapes (after `net.blobs[name].reshape(...)`) through every layer."""
        self._net.reshape()

    # ------------------------------------------------------------ Caffe's per-layer callbacks: run(layer index)

    def before_forward(self, run):
        """Calls `run(i)` before layer i's forward from now on, in every pass (training in a solver too)."""
        self._net.param_needed_hooks.append(_callable(run, "before_forward(run): run"))

    def after_forward(self, run):
        """Calls `run(i)` after layer i's forward from now on."""
        self._net.after_forward_hooks.append(_callable(run, "after_forward(run): run"))

    def before_backward(self, run):
        """Calls `run(i)` before layer i's backward from now on (also for a layer that skips it, as Caffe)."""
        self._net.before_backward_hooks.append(_callable(run, "before_backward(run): run"))

    def after_backward(self, run):
        """Calls `run(i)` after layer i's backward from now on (also for a layer that skips it, as Caffe)."""
        self._net.grads_ready_hooks.append(_callable(run, "after_backward(run): run"))

    # ------------------------------------------------------------ whole data sets in batches

    @staticmethod
    def _item_count(arrays):
        """The number of items each of the arrays {name: array} holds (all the same)."""
        counts = {name: len(a) for name, a in arrays.items()}
        if len(set(counts.values())) > 1:
            raise ValueError(f"the arrays must hold the same number of items, got {counts}")
        return next(iter(counts.values()))

    def _batches(self, arrays):
        """{name: array} cut into the net's batches; the last one is padded with zeros to a full batch."""
        self._blob_list(arrays, "arrays by blob name")
        num = self._item_count(arrays)
        batch_size = self._net.blobs[next(iter(arrays))].shape[0]
        for i in range(0, num, batch_size):
            batch = {name: numpy.asarray(a[i:i + batch_size]) for name, a in arrays.items()}
            pad = batch_size - min(batch_size, num - i)
            if pad:
                batch = {name: numpy.concatenate([a, numpy.zeros((pad,) + a.shape[1:], a.dtype)])
                         for name, a in batch.items()}
            yield batch

    @staticmethod
    def _gather(chunks, count):
        """{name: [batch arrays]} as {name: one host array of the first `count` items}."""
        return {name: numpy.concatenate([sio.to_host(a) for a in arrays])[:count] for name, arrays in chunks.items()}

    def forward_all(self, blobs=None, **inputs):
        """forward() over arrays of any length (input name -> N items), batch by batch; returns
        {name: array of N items} of the outputs and the extra `blobs` (a short last batch is padded
        with zeros and the padding dropped)."""
        if not inputs:
            raise ValueError(f"forward_all(): give the input arrays by name ({', '.join(self.inputs)})")
        count = self._item_count(inputs)
        outs = collections.defaultdict(list)
        for batch in self._batches(inputs):
            for name, array in self.forward(blobs=blobs, **batch).items():
                outs[name].append(array.copy())
        return self._gather(outs, count)

    def forward_backward_all(self, blobs=None, diffs=None, **arrays):
        """forward() and backward() over arrays of any length: input names give the forward's inputs,
        output names the backward's top diffs (either may be left out: the blobs keep what they hold);
        returns ({name: outputs and `blobs`}, {name: input diffs and `diffs`}), N items each."""
        forward_in = {n: a for n, a in arrays.items() if n in self.inputs}
        backward_in = {n: a for n, a in arrays.items() if n in self.outputs}
        unknown = sorted(set(arrays) - set(forward_in) - set(backward_in))
        if unknown or not arrays:
            raise ValueError(f"forward_backward_all(): got {sorted(arrays)}; give arrays for inputs {self.inputs} "
                             f"and/or outputs {self.outputs}")
        count = self._item_count(arrays)
        outs, grads = collections.defaultdict(list), collections.defaultdict(list)
        forward_batches = self._batches(forward_in) if forward_in else iter(())
        backward_batches = self._batches(backward_in) if backward_in else iter(())
        for fb, bb in itertools.zip_longest(forward_batches, backward_batches, fillvalue={}):
            for name, array in self.forward(blobs=blobs, **fb).items():
                outs[name].append(array.copy())
            for name, array in self.backward(diffs=diffs, **bb).items():
                grads[name].append(array.copy())
        return self._gather(outs, count), self._gather(grads, count)

    def set_input_arrays(self, data, labels):
        """Hands N x C x H x W `data` and N `labels` to the net's first layer, a MemoryData layer
        (N a multiple of its batch_size); keep the arrays unchanged while the net uses them."""
        first = self._net.layers[0] if self._net.layers else None
        if getattr(first, "type", None) != "MemoryData":
            raise RuntimeError("set_input_arrays may only be called if the first layer is a MemoryData layer "
                               f"({self._net.source} starts with {getattr(first, 'type', 'no layer')})")
        first.set_input_arrays(data, labels)

    # ------------------------------------------------------------ gradients

    def clear_param_diffs(self):
        """Zeroes the gradients of every learnable parameter (Caffe's ClearParamDiffs)."""
        self._net.clear_param_diffs()

    # ------------------------------------------------------------ weights

    def copy_from(self, weights):
        """Loads a .caffemodel (or .caffemodel.h5) into the layers of the same name."""
        self._net.copy_trained_layers_from(weights)

    def share_with(self, other):
        """Uses `other`'s parameter arrays in the layers of the same name."""
        self._net.share_trained_layers_with(other._net)

    def save(self, path):
        """Writes the weights as a binary .caffemodel."""
        self._net.save(path)

    def save_hdf5(self, path):
        """Writes the weights as HDF5 (Caffe's Net::ToHDF5 layout, what .caffemodel.h5 files hold)."""
        self._net.save_hdf5(path)

    def load_hdf5(self, path):
        """Loads weights from an HDF5 file that save_hdf5 (or Caffe) wrote, whatever its name."""
        if not sio.is_hdf5_file(path):
            raise ValueError(f"{os.fspath(path)}: not an HDF5 weights file; copy_from() reads a binary .caffemodel")
        self._net.copy_trained_layers_from(path)

    def close(self):
        """Stops the data readers and closes the databases of this net."""
        self._net.close()


# ---------------------------------------------------------------- solvers

class _PythonCallback(SolverCallback):
    """The two functions of pycaffe's Solver.add_callback as a solver callback."""

    def __init__(self, on_start, on_gradients_ready):
        self.on_start, self.on_gradients_ready = on_start, on_gradients_ready


class Solver(Closing):
    """A solver made from a solver prototxt, with pycaffe's interface: `net`, `test_nets`, `iter`,
    `max_iter`, `step(n)`, `solve()`, `snapshot()`, `restore(path)`, `add_callback`, `share_weights`.
    Its nets are made in the current mode, and its test nets share the training net's weights from the start.

    `Solver(path)` uses the file's `type`; get_solver(path) too, as the class of that type (SGDSolver,
    AdamSolver ...), and SGDSolver(path), AdamSolver(path) ... force theirs.
    """

    type = None

    def __init__(self, solver_file):
        solver_file = os.fspath(solver_file)
        self._make(solver_file, read_solver_file(solver_file))

    def _make(self, solver_file, param):
        cls = solver_class(self.type or param.type)
        self._solver = cls(param, source=solver_file, net_kwargs={"xp": _array_module()})
        # Test nets see the training weights from the start, not only after the first test
        # (Caffe shares them in Solver::Test, so a test net read before it holds filler values).
        for net in self._solver.test_nets:
            net.share_trained_layers_with(self._solver.net)
        self.net = Net._wrap(self._solver.net)
        self.test_nets = [Net._wrap(net) for net in self._solver.test_nets]

    @property
    def iter(self):
        return self._solver.iter

    @property
    def max_iter(self):
        return self._solver.param.max_iter

    @property
    def param(self):
        return self._solver.param

    def step(self, iters):
        """Runs `iters` training iterations (tests and snapshots fall due as in Caffe)."""
        self._solver.step(int(iters))

    def solve(self, resume_file=None):
        """Trains to max_iter, optionally resuming from a .solverstate first."""
        self._solver.solve(resume_file)

    def snapshot(self):
        """Writes <prefix>_iter_<N>.caffemodel and .solverstate; returns the model file name."""
        return self._solver.snapshot()

    def restore(self, state_file):
        self._solver.restore(state_file)

    def apply_update(self):
        """Turns the gradients in the params' diffs into one update of the weights at this iteration's
        learning rate (Caffe's ApplyUpdate: clip, normalize, regularize, step); `iter` stays as it is."""
        self._solver.apply_update()

    def test(self, test_net_id=0):
        """Scores test net `test_net_id` over its test_iter batches; returns {output: mean}."""
        return self._solver.test(test_net_id)

    def add_callback(self, on_start, on_gradients_ready):
        """Calls `on_start()` before each iteration's forward/backward passes and `on_gradients_ready()`
        after them, before the update, in every iteration that step() or solve() runs from now on."""
        self._solver.callbacks.append(_PythonCallback(_callable(on_start, "add_callback(): on_start"),
                                                      _callable(on_gradients_ready, "add_callback(): on_gradients_ready")))

    def share_weights(self, net):
        """Makes `net` use the training net's parameter arrays in its layers of the same name, so it
        sees every update the solver makes (Caffe's share_weights: net.share_with(solver.net))."""
        if not isinstance(net, Net):
            raise TypeError(f"share_weights() takes a caffe.Net, got {type(net).__name__}")
        net.share_with(self.net)

    def close(self):
        self._solver.close()


class SGDSolver(Solver):
    type = "SGD"

    @property
    def lr(self):
        """The learning rate of the coming update (Caffe's GetLearningRate)."""
        return self._solver.get_learning_rate()


# As in Caffe, every other solver is an SGDSolver.
class NesterovSolver(SGDSolver):
    type = "Nesterov"


class AdaGradSolver(SGDSolver):
    type = "AdaGrad"


class RMSPropSolver(SGDSolver):
    type = "RMSProp"


class AdaDeltaSolver(SGDSolver):
    type = "AdaDelta"


class AdamSolver(SGDSolver):
    type = "Adam"


_SOLVERS_BY_TYPE = {cls.type: cls for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                                               AdaDeltaSolver, AdamSolver)}


def get_solver(solver_file):
    """The solver the file describes, as the class of its `type` (default SGD): an AdamSolver for
    `type: "Adam"`, and so on (a Solver for a type pycaffe has no class for)."""
    solver_file = os.fspath(solver_file)
    param = read_solver_file(solver_file)
    solver = Solver.__new__(_SOLVERS_BY_TYPE.get(param.type, Solver))
    solver._make(solver_file, param)
    return solver
