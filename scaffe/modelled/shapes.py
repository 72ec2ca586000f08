"""A net's layers as the compute model sees them: each layer's top shapes, learnable blob shapes (with
their lr_mult and decay_mult), and the floating-point operations and bytes of its forward and backward,
from the prototxt alone, with the layers' own geometry rules: no layer is built, no activation allocated,
no kernel imported.

Work per layer, at the net's batch (4-byte floats):
- Convolution and InnerProduct: 2 multiply-adds' worth of FLOPs per weight use in forward; backward computes
  the weights' gradient and, where the bottom has one (it depends on parameters), the bottom's.
- Every other layer moves memory: forward reads its bottoms and writes its tops; backward reads the tops'
  gradients and the data it needs and writes the bottoms' gradients (1.5x the forward's bytes). LRN keeps
  its scale too (2x). Split and Flatten share their bottom's data in forward; data layers cost nothing
  (their batches are prefetched).
"""
import math

from kernels.geometry import conv_output_size, pooled_size
from scaffe.layer_impls._helpers import pair_field, spatial_geometry
from scaffe.net_filter import filter_net
from scaffe.proto import caffe_pb2

DATA_TYPES = ("Data", "Input", "DummyData", "ImageData", "HDF5Data", "MemoryData", "WindowData")
ELEMENTWISE = ("ReLU", "Sigmoid", "TanH", "Dropout", "BatchNorm", "Scale", "Bias", "Power", "AbsVal", "ELU",
               "BNLL", "Exp", "Log", "Swish", "Clip", "PReLU", "Softmax", "MVN", "Threshold")
NO_TOPS_TYPES = ("Silence",)
SCALAR_TOPS = ("SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss", "Accuracy", "HingeLoss",
               "MultinomialLogisticLoss", "InfogainLoss", "ContrastiveLoss")


class ModelError(ValueError):
    """The compute model cannot describe this net (a layer type it does not know, a shape it cannot tell)."""


class LayerModel:
    """One layer: `name`, `type`, `tops` (name -> shape), `params` ((shape, lr_mult, decay_mult) per
    learnable blob), and per pass (forward, backward) its `flops` and `bytes` and its `kernels` (launches)."""
    __slots__ = ("name", "type", "tops", "params", "flops", "bytes", "kernels")

    def __init__(self, name, type_, tops, params=(), flops=(0, 0), nbytes=(0, 0), kernels=(0, 0)):
        self.name, self.type, self.tops, self.params = name, type_, tops, list(params)
        self.flops, self.bytes, self.kernels = flops, nbytes, kernels


def _count(shape):
    return math.prod(shape)


def _params(lp, shapes):
    """(shape, lr_mult, decay_mult) of each blob in `shapes`, from the layer's `param` specs."""
    out = []
    for k, shape in enumerate(shapes):
        spec = lp.param[k] if k < len(lp.param) else None
        lr = spec.lr_mult if spec is not None and spec.HasField("lr_mult") else 1.0
        decay = spec.decay_mult if spec is not None and spec.HasField("decay_mult") else 1.0
        if spec is not None and spec.name:
            raise ModelError(f"layer '{lp.name}': shared parameters ('{spec.name}') are not modelled")
        out.append((tuple(shape), lr, decay))
    return out


def _data_tops(lp, data_shape):
    if lp.type == "Input":
        return [tuple(s.dim) for s in lp.input_param.shape]
    if lp.type == "DummyData":
        p = lp.dummy_data_param
        if len(p.shape):
            shapes = [tuple(s.dim) for s in p.shape]
        else:
            shapes = [(n, c, h, w) for n, c, h, w in zip(p.num, p.channel, p.height, p.width)]
        return shapes if len(shapes) == len(lp.top) else shapes[:1] * len(lp.top)
    if lp.type == "Data":
        if data_shape is None:
            raise ModelError(f"layer '{lp.name}': the image shape of a Data layer must be given (data_shape)")
        batch = lp.data_param.batch_size
        crop = lp.transform_param.crop_size
        c, h, w = data_shape
        image = (batch, c, crop or h, crop or w)
        return [image, (batch,)][:len(lp.top)]
    raise ModelError(f"layer '{lp.name}': {lp.type} data layers are not modelled; use Data, Input or DummyData")


def layer_models(net_param, data_shape=None):
    """The LayerModels of `net_param`'s TRAIN-phase layers, in order (`data_shape`: (C, H, W) of a Data
    layer's images, which only its database knows)."""
    train = caffe_pb2.NetParameter()
    train.CopyFrom(net_param)
    train.state.phase = caffe_pb2.TRAIN
    param = filter_net(train)
    shapes, layers = {}, []
    learned = set()  # blobs that depend on learnable parameters: their gradients are computed in backward
    for lp in param.layer:
        bottoms = []
        for name in lp.bottom:
            if name not in shapes:
                raise ModelError(f"layer '{lp.name}': unknown bottom blob '{name}'")
            bottoms.append(shapes[name])
        model = _layer(lp, bottoms, data_shape, any(name in learned for name in lp.bottom))
        shapes.update(model.tops)
        if model.params or any(name in learned for name in lp.bottom):
            learned.update(model.tops)
        layers.append(model)
    return layers


def _layer(lp, bottoms, data_shape, bottom_gradients):
    """`bottom_gradients`: whether backward computes a gradient for some bottom (one depends on parameters)."""
    t = lp.type
    if t in DATA_TYPES:
        return LayerModel(lp.name, t, dict(zip(lp.top, _data_tops(lp, data_shape))))
    if t in NO_TOPS_TYPES:
        return LayerModel(lp.name, t, {})
    if not bottoms:
        raise ModelError(f"layer '{lp.name}' ({t}) has no bottom")
    if t in ELEMENTWISE or t == "Split":
        return _same_shape(lp, bottoms)
    if t in SCALAR_TOPS:
        return _moving(lp, {top: () for top in lp.top}, bottoms)
    rule = LAYERS.get(t)
    if rule is None:
        raise ModelError(f"layer '{lp.name}': the compute model does not know layer type {t}")
    return rule(lp, bottoms, bottom_gradients)


def _convolution(lp, bottoms, bottom_gradients):
    p = lp.convolution_param
    n, c, h, w = bottoms[0]
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = spatial_geometry(p, lp)
    group = p.group or 1
    if lp.type == "Convolution":
        oh, ow = conv_output_size(h, kh, ph, sh, dh), conv_output_size(w, kw, pw, sw, dw)
        weights = (p.num_output, c // group, kh, kw)
        flops = 2 * n * p.num_output * oh * ow * (c // group) * kh * kw
    else:
        oh = sh * (h - 1) + dh * (kh - 1) + 1 - 2 * ph
        ow = sw * (w - 1) + dw * (kw - 1) + 1 - 2 * pw
        weights = (c, p.num_output // group, kh, kw)
        flops = 2 * n * c * h * w * (p.num_output // group) * kh * kw
    blobs = [weights] + ([(p.num_output,)] if p.bias_term else [])
    return _compute(lp, (n, p.num_output, oh, ow), blobs, flops, bottoms, bottom_gradients)


def _inner_product(lp, bottoms, bottom_gradients):
    p, first = lp.inner_product_param, bottoms[0]
    axis = p.axis % len(first)
    k, outer = _count(first[axis:]), _count(first[:axis])
    blobs = [(k, p.num_output) if p.transpose else (p.num_output, k)] + ([(p.num_output,)] if p.bias_term else [])
    return _compute(lp, tuple(first[:axis]) + (p.num_output,), blobs, 2 * outer * k * p.num_output, bottoms,
                    bottom_gradients)


def _pooling(lp, bottoms, bottom_gradients):
    p = lp.pooling_param
    n, c, h, w = bottoms[0]
    if p.global_pooling:
        return _moving(lp, {lp.top[0]: (n, c, 1, 1)}, bottoms)
    (kh, kw), (ph, pw), (sh, sw) = (pair_field(p, *fields) for fields in (
        ("kernel_size", "kernel_h", "kernel_w"), ("pad", "pad_h", "pad_w"), ("stride", "stride_h", "stride_w")))
    ceil = p.round_mode == caffe_pb2.PoolingParameter.CEIL
    top = (n, c, pooled_size(h, kh, ph, sh, ceil), pooled_size(w, kw, pw, sw, ceil))
    return _moving(lp, {lp.top[0]: top}, bottoms)


def _same_shape(lp, bottoms):
    """An elementwise layer (or Split): its tops are its first bottom's shape; some hold per-channel blobs."""
    t, first = lp.type, bottoms[0]
    blobs = []
    if t == "Scale" and len(bottoms) == 1:
        blobs = [(first[1],)] + ([(first[1],)] if lp.scale_param.bias_term else [])
    elif t == "Bias" and len(bottoms) == 1:
        blobs = [(first[1],)]
    elif t == "PReLU":
        blobs = [(1,) if lp.prelu_param.channel_shared else (first[1],)]
    model = _moving(lp, {top: first for top in lp.top}, bottoms, shared=t == "Split")
    # BatchNorm's statistics are blobs Caffe never updates by gradient (their lr_mult is 0).
    model.params = [(s, 0.0, 0.0) for s in [(first[1],), (first[1],), (1,)]] if t == "BatchNorm" \
        else _params(lp, blobs)
    return model


def _concat(lp, bottoms, bottom_gradients):
    first = bottoms[0]
    axis = (lp.concat_param.axis if lp.concat_param.HasField("axis") else 1) % len(first)
    top = list(first)
    top[axis] = sum(b[axis] for b in bottoms)
    return _moving(lp, {lp.top[0]: tuple(top)}, bottoms)


LAYERS = {
    "Convolution": _convolution,
    "Deconvolution": _convolution,
    "InnerProduct": _inner_product,
    "Pooling": _pooling,
    "LRN": lambda lp, bottoms, _: _moving(lp, {lp.top[0]: bottoms[0]}, bottoms, factor=2.0),
    "Eltwise": lambda lp, bottoms, _: _moving(lp, {lp.top[0]: bottoms[0]}, bottoms),
    "Concat": _concat,
    "Flatten": lambda lp, bottoms, _: _moving(lp, {lp.top[0]: (bottoms[0][0], _count(bottoms[0][1:]))}, bottoms,
                                              shared=True),
}


def _compute(lp, top, blobs, flops, bottoms, bottom_gradients):
    """A GEMM layer: `flops` in forward; in backward as many for the weights' gradient, and as many again
    for the bottom's where it has one."""
    weights = sum(_count(b) for b in blobs)
    nbytes = 4 * (sum(_count(b) for b in bottoms) + _count(top) + weights)
    passes = 2 if bottom_gradients else 1
    return LayerModel(lp.name, lp.type, {lp.top[0]: top}, _params(lp, blobs),
                      (flops, passes * flops), (nbytes, passes * nbytes), (1, passes))


def _moving(lp, tops, bottoms, factor=1.0, shared=False):
    """A layer that moves memory: its bottoms in and its tops out (none when its tops share the bottom's)."""
    moved_in = sum(_count(b) for b in bottoms)
    out = 0 if shared else sum(_count(shape) for shape in tops.values())
    forward = 4 * (moved_in + out) * factor if not shared else 0
    backward = 4 * (moved_in + out) * 1.5 * factor if lp.type != "Flatten" else 0
    return LayerModel(lp.name, lp.type, tops, (), (moved_in, moved_in), (forward, backward),
                      (0 if shared else 1, 0 if lp.type == "Flatten" else 1))
