"""Upgrades of old Caffe net and solver definitions to today's format, the steps Caffe's
upgrade_proto applies on load: V0 layers (padding layers folded into the next convolution or
pooling) -> V1 `layers { type: CONVOLUTION }` -> `layer { type: "Convolution" }`, data
transformation fields -> transform_param, net inputs -> an Input layer, old BatchNorm parameter
specs, and the solver_type enum -> `type`.

`upgrade_net` and `upgrade_solver` work in place and log each step as Caffe does. A field that
has no place in the new format is logged as a warning and dropped (Caffe: "continuing anyway");
they return False then, which the upgrade tools turn into exit status 1. A net that cannot be
upgraded at all raises CaffeFormatError.
"""
from scaffe.messages import CaffeFormatError, copy_message
from scaffe.log import get_logger
from scaffe.proto import caffe_pb2

__all__ = ["net_needs_upgrade", "upgrade_net", "solver_needs_upgrade", "upgrade_solver",
           "V0_LAYER_TYPES", "V1_LAYER_TYPES", "SOLVER_TYPE_NAMES"]

log = get_logger(__name__)

_V1 = caffe_pb2.V1LayerParameter

# V0 type strings -> V1 enum (UpgradeV0LayerType); any other V0 type is an error.
V0_LAYER_TYPES = {
    "accuracy": _V1.ACCURACY, "bnll": _V1.BNLL, "concat": _V1.CONCAT, "conv": _V1.CONVOLUTION,
    "data": _V1.DATA, "dropout": _V1.DROPOUT, "euclidean_loss": _V1.EUCLIDEAN_LOSS, "flatten": _V1.FLATTEN,
    "hdf5_data": _V1.HDF5_DATA, "hdf5_output": _V1.HDF5_OUTPUT, "im2col": _V1.IM2COL, "images": _V1.IMAGE_DATA,
    "infogain_loss": _V1.INFOGAIN_LOSS, "innerproduct": _V1.INNER_PRODUCT, "lrn": _V1.LRN,
    "multinomial_logistic_loss": _V1.MULTINOMIAL_LOGISTIC_LOSS, "pool": _V1.POOLING, "relu": _V1.RELU,
    "sigmoid": _V1.SIGMOID, "softmax": _V1.SOFTMAX, "softmax_loss": _V1.SOFTMAX_LOSS, "split": _V1.SPLIT,
    "tanh": _V1.TANH, "window_data": _V1.WINDOW_DATA,
}

# V1 enum -> the layer type string of today's format (UpgradeV1LayerType).
V1_LAYER_TYPES = {
    _V1.NONE: "", _V1.ABSVAL: "AbsVal", _V1.ACCURACY: "Accuracy", _V1.ARGMAX: "ArgMax", _V1.BNLL: "BNLL",
    _V1.CONCAT: "Concat", _V1.CONTRASTIVE_LOSS: "ContrastiveLoss", _V1.CONVOLUTION: "Convolution",
    _V1.DECONVOLUTION: "Deconvolution", _V1.DATA: "Data", _V1.DROPOUT: "Dropout", _V1.DUMMY_DATA: "DummyData",
    _V1.EUCLIDEAN_LOSS: "EuclideanLoss", _V1.ELTWISE: "Eltwise", _V1.EXP: "Exp", _V1.FLATTEN: "Flatten",
    _V1.HDF5_DATA: "HDF5Data", _V1.HDF5_OUTPUT: "HDF5Output", _V1.HINGE_LOSS: "HingeLoss", _V1.IM2COL: "Im2col",
    _V1.IMAGE_DATA: "ImageData", _V1.INFOGAIN_LOSS: "InfogainLoss", _V1.INNER_PRODUCT: "InnerProduct",
    _V1.LRN: "LRN", _V1.MEMORY_DATA: "MemoryData", _V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss",
    _V1.MVN: "MVN", _V1.POOLING: "Pooling", _V1.POWER: "Power", _V1.RELU: "ReLU", _V1.SIGMOID: "Sigmoid",
    _V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", _V1.SILENCE: "Silence", _V1.SOFTMAX: "Softmax",
    _V1.SOFTMAX_LOSS: "SoftmaxWithLoss", _V1.SPLIT: "Split", _V1.SLICE: "Slice", _V1.TANH: "TanH",
    _V1.WINDOW_DATA: "WindowData", _V1.THRESHOLD: "Threshold",
}

# The names Caffe gives the values of the deprecated solver_type enum.
SOLVER_TYPE_NAMES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}

_CONV = ("convolution_param", None)
_IP = ("inner_product_param", None)
_TRANSFORM = {"*": ("transform_param", None)}
_BY_DATA_TYPE = {"data": ("data_param", None), "hdf5_data": ("hdf5_data_param", None),
                 "images": ("image_data_param", None), "window_data": ("window_data_param", None)}

# Where each V0 field goes: {V0 type ("*": any): (V1 parameter message, field there; None: same name)}.
# The V0 pooling enum has the numbers of PoolingParameter's, so its value carries over as is.
_V0_FIELDS = {
    "num_output": {"conv": _CONV, "innerproduct": _IP},
    "biasterm": {"conv": ("convolution_param", "bias_term"), "innerproduct": ("inner_product_param", "bias_term")},
    "weight_filler": {"conv": _CONV, "innerproduct": _IP},
    "bias_filler": {"conv": _CONV, "innerproduct": _IP},
    "pad": {"conv": _CONV, "pool": ("pooling_param", None)},
    "kernelsize": {"conv": ("convolution_param", "kernel_size"), "pool": ("pooling_param", "kernel_size")},
    "group": {"conv": _CONV},
    "stride": {"conv": _CONV, "pool": ("pooling_param", None)},
    "pool": {"pool": ("pooling_param", None)},
    "dropout_ratio": {"dropout": ("dropout_param", None)},
    "local_size": {"lrn": ("lrn_param", None)},
    "alpha": {"lrn": ("lrn_param", None)},
    "beta": {"lrn": ("lrn_param", None)},
    "k": {"lrn": ("lrn_param", None)},
    "source": dict(_BY_DATA_TYPE, infogain_loss=("infogain_loss_param", None)),
    "scale": _TRANSFORM,
    "meanfile": {"*": ("transform_param", "mean_file")},
    "batchsize": {t: (param, "batch_size") for t, (param, _) in _BY_DATA_TYPE.items()},
    "cropsize": {"*": ("transform_param", "crop_size")},
    "mirror": _TRANSFORM,
    "rand_skip": {"data": ("data_param", None), "images": ("image_data_param", None)},
    "shuffle_images": {"images": ("image_data_param", "shuffle")},
    "new_height": {"images": ("image_data_param", None)},
    "new_width": {"images": ("image_data_param", None)},
    "concat_dim": {"concat": ("concat_param", None)},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode")},
    # The whole message moves.
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", "")},
}

# Data layer fields that moved into transform_param.
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")
_DATA_PARAMS = ("data_param", "image_data_param", "window_data_param")


# ---------------------------------------------------------------- nets

def _needs_v0_upgrade(net):
    return any(layer.HasField("layer") for layer in net.layers)


def _needs_data_upgrade(net):
    return any(layer.HasField(p) and getattr(layer, p).HasField(f)
               for layer in list(net.layers) + list(net.layer) for p in _DATA_PARAMS for f in _TRANSFORM_FIELDS)


def _needs_batch_norm_upgrade(net):
    # Old BatchNorm definitions listed three param specs to keep the solver off its statistics
    # blobs; Caffe now sets lr_mult and decay_mult of all three to 0.
    return any(layer.type == "BatchNorm" and len(layer.param) == 3
               and any(p.lr_mult != 0 or p.decay_mult != 0 for p in layer.param) for layer in net.layer)


def _has_input_fields(net):
    return bool(len(net.input) or len(net.input_shape) or len(net.input_dim))


def net_needs_upgrade(net):
    """Whether `upgrade_net` would change the NetParameter (Caffe's NetNeedsUpgrade)."""
    return (bool(len(net.layers)) or _needs_data_upgrade(net) or _has_input_fields(net)
            or _needs_batch_norm_upgrade(net))


def upgrade_net(net, source="<net>"):
    """Upgrades the NetParameter `net` in place to today's format; True when nothing was lost."""
    complete = True
    if _needs_v0_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated V0LayerParameter: %s", source)
        complete &= _upgrade_v0_net(net, source)
    if _needs_data_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated transformation parameters: %s",
                 source)
        _upgrade_data_transformation(net)
    if len(net.layers):
        log.info("Attempting to upgrade input file specified using deprecated V1LayerParameter: %s", source)
        complete &= _upgrade_v1_net(net, source)
    if _has_input_fields(net):
        log.info("Attempting to upgrade input file specified using deprecated input fields: %s", source)
        _upgrade_net_input(net, source)
    if _needs_batch_norm_upgrade(net):
        log.info("Attempting to upgrade batch norm layers using deprecated params: %s", source)
        for layer in net.layer:
            if layer.type == "BatchNorm" and len(layer.param) == 3:
                for spec in layer.param:
                    spec.lr_mult = 0
                    spec.decay_mult = 0
    if not complete:
        log.warning("%s: had one or more problems upgrading the net (see above); continuing anyway", source)
    return complete


# ------------------------------------------------ V0 -> V1

def _fold_padding_layers(net, source):
    """The V1 layer list with each V0 "padding" layer removed and its pad moved into the
    convolution or pooling layer that reads its output (UpgradeV0PaddingLayers)."""
    producer = {name: None for name in net.input}  # blob name -> index of the layer writing it last
    kept = []
    for i, layer in enumerate(net.layers):
        v0 = layer.layer
        if v0.type != "padding":
            kept.append(copy_message(layer))
        for j, blob in enumerate(layer.bottom):
            if blob not in producer:
                raise CaffeFormatError(f"{source}: V0 layer '{v0.name}' reads blob '{blob}', which no earlier "
                                       f"layer or input produces")
            pad_layer = None if producer[blob] is None else net.layers[producer[blob]]
            if pad_layer is None or pad_layer.layer.type != "padding":
                continue
            if v0.type not in ("conv", "pool"):
                raise CaffeFormatError(f"{source}: V0 padding layer '{pad_layer.layer.name}' feeds layer "
                                       f"'{v0.name}' of type '{v0.type}'; only conv and pool can take padding")
            if len(layer.bottom) != 1 or len(pad_layer.bottom) != 1 or len(pad_layer.top) != 1:
                raise CaffeFormatError(f"{source}: V0 padding layer '{pad_layer.layer.name}' and layer "
                                       f"'{v0.name}' must each have exactly one input and output")
            kept[-1].layer.pad = pad_layer.layer.pad
            kept[-1].bottom[j] = pad_layer.bottom[0]
        for blob in layer.top:
            producer[blob] = i
    return kept


def _upgrade_v0_net(net, source):
    complete = True
    layers = _fold_padding_layers(net, source)
    for layer in layers:
        if layer.HasField("layer"):
            complete &= _upgrade_v0_layer(layer, source)
    del net.layers[:]
    net.layers.extend(layers)
    return complete


def _upgrade_v0_layer(layer, source):
    """Rewrites V1 `layer` (holding a V0 definition in its `layer` field) as a plain V1 layer."""
    v0 = layer.layer
    kind = v0.type
    if kind not in V0_LAYER_TYPES:
        raise CaffeFormatError(f"{source}: V0 layer '{v0.name}' has unknown type '{kind}'; known: "
                               f"{', '.join(sorted(V0_LAYER_TYPES))}")
    layer.ClearField("layer")
    complete = True
    for field, value in v0.ListFields():
        name = field.name
        if name == "name":
            layer.name = value
        elif name == "type":
            layer.type = V0_LAYER_TYPES[value]
        elif name in ("blobs", "blobs_lr", "weight_decay"):
            getattr(layer, name).extend(value)
        else:
            targets = _V0_FIELDS.get(name, {})
            target = targets.get(kind, targets.get("*"))
            if target is None:
                log.error("%s: layer '%s': unknown parameter %s for layer type %s; dropped", source, v0.name,
                          name, kind)
                complete = False
                continue
            param_name, new_name = target
            _set_field(getattr(layer, param_name), new_name, name, value)
    return complete


def _set_field(message, new_name, old_name, value):
    if new_name == "":
        message.CopyFrom(value)
        return
    name = new_name or old_name
    current = getattr(message, name)
    if hasattr(current, "CopyFrom"):
        current.CopyFrom(value)
    elif hasattr(current, "append"):
        current.append(value)  # conv pad/kernel_size/stride became repeated
    else:
        setattr(message, name, value)


# ------------------------------------------------ V1 -> today's format

def _upgrade_v1_net(net, source):
    if len(net.layer):
        raise CaffeFormatError(
            f"{source}: the net has both 'layer' and 'layers' fields; the current format is "
            f"layer {{ type: 'Layer' ... }}, the old one layers {{ type: LAYER ... }}: convert the 'layers' "
            f"entries by hand (or upgrade them alone with upgrade_net_proto_text) before mixing")
    complete = True
    new_layers = []
    for i, old in enumerate(net.layers):
        layer, ok = _upgrade_v1_layer(old, source)
        if not ok:
            log.error("%s: upgrade of input layer %d failed", source, i)
        complete &= ok
        new_layers.append(layer)
    net.ClearField("layers")
    net.layer.extend(new_layers)
    return complete


# V1 fields copied as they are, and V1's per-blob lists that become a field of each blob's ParamSpec
# (V1 and ParamSpec number STRICT/PERMISSIVE alike).
_V1_LISTS = ("bottom", "top", "include", "exclude", "blobs", "loss_weight")
_V1_PARAM_SPEC_FIELDS = {"param": "name", "blob_share_mode": "share_mode", "blobs_lr": "lr_mult",
                         "weight_decay": "decay_mult"}


def _upgrade_v1_layer(old, source):
    layer = caffe_pb2.LayerParameter()
    complete = True
    for field, value in old.ListFields():
        name = field.name
        if name in _V1_LISTS:
            getattr(layer, name).extend(value)
        elif name in _V1_PARAM_SPEC_FIELDS:
            _set_param_specs(layer, _V1_PARAM_SPEC_FIELDS[name], value)
        elif name == "name":
            layer.name = value
        elif name == "type":
            layer.type = V1_LAYER_TYPES[value]
        elif name == "layer":
            log.error("%s: layer '%s' still holds a V0 layer definition; ignored", source, old.name)
            complete = False
        else:  # every other V1 field is a *_param message of the same name
            getattr(layer, name).CopyFrom(value)
    return layer, complete


def _set_param_specs(layer, spec_field, values):
    """Sets `spec_field` of the i-th ParamSpec to values[i], adding ParamSpecs as needed."""
    for i, v in enumerate(values):
        while len(layer.param) <= i:
            layer.param.add()
        setattr(layer.param[i], spec_field, v)


# ------------------------------------------------ fields of current-format nets

def _upgrade_net_input(net, source):
    # Besides Caffe's upgrade, scaffe keeps a shapeless `input` as an Input layer the caller shapes.
    if not len(net.input):
        raise CaffeFormatError(f"{source}: input_shape/input_dim given without any 'input' name")
    n = len(net.input)
    if len(net.input_shape) not in (0, n):
        raise CaffeFormatError(f"{source}: {n} inputs but {len(net.input_shape)} input_shape entries")
    if not len(net.input_shape) and len(net.input_dim) not in (0, 4 * n):
        raise CaffeFormatError(f"{source}: {n} inputs need {4 * n} input_dim values, got {len(net.input_dim)}")
    layer = caffe_pb2.LayerParameter(name="input", type="Input")
    for i, name in enumerate(net.input):
        layer.top.append(name)
        if len(net.input_shape):
            layer.input_param.shape.add().CopyFrom(net.input_shape[i])
        elif len(net.input_dim):
            layer.input_param.shape.add().dim.extend(net.input_dim[4 * i:4 * i + 4])
    layers = [layer] + [copy_message(l) for l in net.layer]
    del net.layer[:]
    net.layer.extend(layers)
    for field in ("input", "input_shape", "input_dim"):
        net.ClearField(field)


def _upgrade_data_transformation(net):
    # Caffe only moves these for V1 data layers; scaffe also moves them in current-format layers,
    # so the transformer reads one place only.
    for layer in list(net.layers) + list(net.layer):
        for name in _DATA_PARAMS:
            if not layer.HasField(name):
                continue
            p = getattr(layer, name)
            t = layer.transform_param
            for field in _TRANSFORM_FIELDS:
                if p.HasField(field):
                    setattr(t, field, getattr(p, field))
                    p.ClearField(field)


# ---------------------------------------------------------------- solvers

def solver_needs_upgrade(solver):
    nets = _inline_nets(solver)
    return solver.HasField("solver_type") or any(net_needs_upgrade(n) for n in nets)


def _inline_nets(solver):
    nets = [getattr(solver, f) for f in ("net_param", "train_net_param") if solver.HasField(f)]
    return nets + list(solver.test_net_param)


def upgrade_solver(solver, source="<solver>"):
    """Upgrades the SolverParameter in place: `solver_type: ADAM` becomes `type: "Adam"`, and nets
    given inline (net_param, train_net_param, test_net_param) are upgraded like net files.
    Returns True when nothing was lost."""
    if solver.HasField("solver_type"):
        name = SOLVER_TYPE_NAMES[solver.solver_type]
        if solver.HasField("type") and solver.type != name:
            raise CaffeFormatError(
                f"{source}: both solver_type ({name}) and type ({solver.type}) are given; keep only 'type'")
        log.info("Attempting to upgrade input file specified using deprecated 'solver_type' field (enum): %s",
                 source)
        solver.type = name
        solver.ClearField("solver_type")
    complete = True
    for net in _inline_nets(solver):
        if net_needs_upgrade(net):
            complete &= upgrade_net(net, source)
    return complete
