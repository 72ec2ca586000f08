"""pycaffe's NetSpec: nets written as Python calls (`L.Convolution(n.data, num_output=20)`) that become a
NetParameter, with Caffe's names (`caffe.layers` as L, `caffe.params` as P, `caffe.NetSpec`, `caffe.to_proto`).

A call on `layers` makes a Function (one layer: its type, input Tops and keyword parameters) and returns
its output Tops. Keywords fill the layer's own parameter message (`num_output` goes to
`convolution_param` of a Convolution), a keyword ending in `param` fills that field of the layer
(`param=[dict(lr_mult=1)]`, `transform_param=dict(scale=0.5)`), and any other keyword a field of
LayerParameter itself (`loss_weight`, `include`, `name`). `ntop=N` sets the number of outputs
(0 returns the Function itself) and `in_place=True` writes the output into the input blob.
Lists fill repeated fields, a lone value a one-element repeated field, dicts fill messages.

Names: a NetSpec names each Top after the attribute it was assigned to and each layer after its
first top; everything unnamed gets the layer type and a counter (`Convolution1`), as Caffe does.
"""
import collections

import numpy

from scaffe.proto import caffe_pb2

__all__ = ["NetSpec", "Top", "Function", "layers", "params", "to_proto", "assign_proto"]

# Layer types that read another type's parameter message (Caffe's Deconvolution reads convolution_param).
_SHARED_PARAM_TYPES = {"Deconvolution": "Convolution", "Im2col": "Convolution", "RNN": "Recurrent",
                       "LSTM": "Recurrent"}


def _param_fields():
    """Layer type -> its LayerParameter field: `ConvolutionParameter convolution_param` gives
    Convolution -> convolution_param (Caffe's own naming rule between the two)."""
    fields = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        message = field.message_type
        if field.name.endswith("_param") and message is not None and message.name.endswith("Parameter"):
            fields[message.name[:-len("Parameter")]] = field.name
    for layer_type, owner in _SHARED_PARAM_TYPES.items():
        if owner in fields:
            fields[layer_type] = fields[owner]
    return fields


_PARAM_FIELDS = _param_fields()


def assign_proto(message, name, value):
    """Sets field `name` of protobuf `message` from a Python value: a dict fills a message field, a list
    (or tuple, or numpy array) a repeated field (a lone value there becomes a one-element list), anything
    else is set as is (protobuf takes numbers, numpy scalars, strings and enum names)."""
    field = message.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        raise AttributeError(f"{message.DESCRIPTOR.name} has no field {name!r}")
    if isinstance(value, numpy.ndarray):
        value = value.tolist()
    if field.is_repeated:
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if field.message_type is None:
                getattr(message, name).append(item)
            else:
                _fill_message(getattr(message, name).add(), item, name)
    elif field.message_type is not None:
        _fill_message(getattr(message, name), value, name)
    else:
        setattr(message, name, value)


def _fill_message(message, value, name):
    if isinstance(value, dict):
        for key, item in value.items():
            assign_proto(message, key, item)
    elif hasattr(value, "DESCRIPTOR"):
        message.CopyFrom(value)
    else:
        raise TypeError(f"{name} is a {message.DESCRIPTOR.name} message: give it a dict, not {type(value).__name__}")


class Top:
    """One output blob of a layer: output `n` of Function `fn`."""

    def __init__(self, fn, n):
        self.fn = fn
        self.n = n

    def to_proto(self):
        """A NetParameter with every layer this top needs, names made up (see NetSpec to choose them)."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames):
        self.fn._to_proto(layers, names, autonames)


class Function:
    """One layer: its Caffe type, its input Tops and its keyword parameters (`ntop` and `in_place` taken out)."""

    def __init__(self, type_name, inputs, params):
        for index, given in enumerate(inputs):
            if not isinstance(given, Top):
                raise TypeError(f"{type_name} input {index} is not a Top (type is {type(given)})")
        self.type_name = type_name
        self.inputs = tuple(inputs)
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _auto_name(self, autonames):
        autonames[self.type_name] += 1
        return f"{self.type_name}{autonames[self.type_name]}"

    def _top_name(self, top, names, autonames):
        if top not in names:
            names[top] = top.fn._auto_name(autonames)
        return names[top]

    def _layer_name(self, names, autonames):
        # A layer is named after its first top; a top-less one by its own NetSpec name or type and counter.
        if self not in names:
            names[self] = (self._top_name(self.tops[0], names, autonames) if self.tops
                           else self._auto_name(autonames))
        return names[self]

    def _to_proto(self, layers, names, autonames):
        """Adds this layer to `layers` (Function -> LayerParameter, in net order) after the layers it reads."""
        if self in layers:
            return
        bottoms = []
        for top in self.inputs:
            top._to_proto(layers, names, autonames)
            bottoms.append(layers[top.fn].top[top.n])
        layer = caffe_pb2.LayerParameter(type=self.type_name, bottom=bottoms)
        if self.in_place:
            layer.top.extend(bottoms)
        else:
            layer.top.extend(self._top_name(top, names, autonames) for top in self.tops)
        layer.name = self._layer_name(names, autonames)
        for key, value in self.params.items():
            self._assign(layer, key, value)
        layers[self] = layer

    def _assign(self, layer, key, value):
        type_field = _PARAM_FIELDS.get(self.type_name)
        if type_field and not key.endswith("param") and key in getattr(layer, type_field).DESCRIPTOR.fields_by_name:
            target = getattr(layer, type_field)
        elif key in layer.DESCRIPTOR.fields_by_name:
            target = layer
        else:
            where = f"of neither {type_field} nor LayerParameter" if type_field else "not of LayerParameter"
            raise AttributeError(f"{self.type_name} layer {layer.name!r}: {key!r} is a field {where}")
        try:
            assign_proto(target, key, value)
        except (AttributeError, TypeError, ValueError) as error:
            raise type(error)(f"{self.type_name} layer {layer.name!r}, {key}: {error}") from None


def to_proto(*tops):
    """A NetParameter with every layer needed to compute `tops`, their blobs and layers named automatically."""
    layers = {}
    autonames = collections.Counter()
    for top in tops:
        top._to_proto(layers, {}, autonames)
    return caffe_pb2.NetParameter(layer=layers.values())


class NetSpec:
    """Tops (or top-less Functions) assigned as attributes or items, named by those attributes;
    `to_proto()` gives the NetParameter with every layer they need, in assignment order."""

    def __init__(self):
        super().__setattr__("tops", collections.OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        if name == "tops":  # not set yet (copy/pickle make the object without __init__)
            raise AttributeError(name)
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top {name!r} (it has {', '.join(self.tops) or 'none'})") from None

    def __setitem__(self, name, value):
        self.tops[name] = value

    def __getitem__(self, name):
        return self.tops[name]

    def to_proto(self):
        names = {value: name for name, value in self.tops.items()}
        autonames = collections.Counter()
        layers = {}
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        return caffe_pb2.NetParameter(layer=layers.values())


class Layers:
    """`layers.Convolution(bottom, kernel_size=3)`: any layer type as a function of its input Tops that returns
    its output Top (a tuple of Tops for ntop > 1, the Function for ntop=0)."""

    def __getattr__(self, type_name):
        if type_name.startswith("_"):
            raise AttributeError(type_name)

        def layer(*inputs, **params):
            fn = Function(type_name, inputs, params)
            if fn.ntop == 0:
                return fn
            return fn.tops[0] if fn.ntop == 1 else fn.tops
        layer.__name__ = layer.__qualname__ = type_name
        return layer


class _ParameterEnums:
    """The constants of one XParameter message: `params.Pooling.MAX` is PoolingParameter.MAX."""

    def __init__(self, message):
        self._message = message

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return getattr(self._message, name)
        except AttributeError:
            raise AttributeError(f"{self._message.DESCRIPTOR.name} has no constant {name!r}") from None


class Parameters:
    """`params.Pooling.MAX`, `params.Eltwise.SUM`, ...: the enum values of Caffe's XParameter messages."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, f"{name}Parameter", None)
        if message is None:
            raise AttributeError(f"caffe.proto has no {name}Parameter message")
        return _ParameterEnums(message)


layers = Layers()
params = Parameters()
