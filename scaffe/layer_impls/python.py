"""Python layer (Caffe's "Python"): a layer whose steps are a Python class, named by python_param.

`python_param { module: "pyloss" layer: "EuclideanLossLayer" param_str: "..." }` imports `pyloss`
(from PYTHONPATH, as Caffe does; its `import caffe` gives scaffe) and builds `EuclideanLossLayer(layer_param)`, a subclass of
`scaffe.Layer` (pycaffe's `caffe.Layer`). It trains like a built-in layer, in a Solver, `scaffe train`
and under mpiexec (each rank builds its own instance, so `share_in_parallel` has nothing to share).
"""
import importlib

from scaffe.blob_view import BlobVec, BlobView
from scaffe.caffe_alias import alias_caffe
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer as _CoreLayer


class Layer:
    """pycaffe's `caffe.Layer`: subclass it and define `setup(bottom, top)`, `reshape(bottom, top)`,
    `forward(bottom, top)` and `backward(top, propagate_down, bottom)`.

    `bottom` and `top` are lists of pycaffe blobs (`.data`, `.diff`, `.reshape(*shape)`); reshape runs
    before every forward, as Caffe's Layer::Forward does. The layer has `param_str` (python_param's
    string), `phase` (scaffe.TRAIN or scaffe.TEST) and `blobs`, its learnable parameters: make them in
    setup with `self.blobs.add_blob(*shape)`, and accumulate their gradients into `.diff` in backward.
    A Python layer is no loss layer by default: give its top `loss_weight: 1` for it to count as one.
    """

    type = "Python"

    def __init__(self, param):
        self.param_str = param.python_param.param_str
        self.phase = int(param.phase)
        self.blobs = BlobVec([])

    def setup(self, bottom, top):
        """Reads `param_str`, checks the bottoms and makes `blobs`; called once."""

    def _missing(self, step):
        return NotImplementedError(f"Python layer class {type(self).__module__}.{type(self).__name__} "
                                   f"defines no {step}(); define it to use the layer this way")

    def reshape(self, bottom, top):
        raise self._missing("reshape")

    def forward(self, bottom, top):
        raise self._missing("forward")

    def backward(self, top, propagate_down, bottom):
        raise self._missing("backward")


def _views(blobs):
    return [BlobView(b) for b in blobs]


def _python_layer(param):
    """The user's layer object that python_param names, built from `param` (a LayerParameter)."""
    spec = param.python_param
    if not spec.module or not spec.layer:
        raise ValueError("python_param needs `module` (a Python module on PYTHONPATH) and `layer` (a class in it)")
    alias_caffe()  # the module may `import caffe`, as Caffe's documented layers do
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as e:
        if e.name != spec.module and not spec.module.startswith(f"{e.name}."):
            raise ValueError(f"python_param.module {spec.module!r} cannot be imported: it imports {e.name!r} ({e}); "
                             f"install {e.name} or put the folder that holds it on PYTHONPATH") from None
        raise ValueError(f"python_param.module {spec.module!r} cannot be imported ({e}); "
                         f"put the folder that holds {spec.module}.py on PYTHONPATH") from None
    cls = getattr(module, spec.layer, None)
    if cls is None:
        raise ValueError(f"module {spec.module!r} ({getattr(module, '__file__', '?')}) has no {spec.layer!r} "
                         f"(python_param.layer)")
    if not (isinstance(cls, type) and issubclass(cls, Layer)):
        raise ValueError(f"{spec.module}.{spec.layer} must be a class derived from caffe.Layer (scaffe.Layer)")
    layer = cls(param)
    if not isinstance(getattr(layer, "blobs", None), BlobVec):
        raise ValueError(f"{spec.module}.{spec.layer}.__init__ must call the base class's "
                         f"__init__(self, param) (caffe.Layer.__init__), which makes its blobs")
    return layer


@register
class PythonLayer(_CoreLayer):
    """The net's side of a Python layer: hands pycaffe blobs to the user's object and shares its
    `blobs` list, so its parameters are saved, loaded, shared, reduced and updated like any layer's."""

    type = "Python"
    # Errors raised by the user's code reach the caller unchanged, with their traceback (pycaffe
    # raises the layer's own exception too), rather than as a one-line NetError.
    raises_own_errors = True

    def __init__(self, param, phase):
        super().__init__(param, phase)
        self.python_layer = _python_layer(param)
        self.blobs = self.python_layer.blobs.blobs

    def setup(self, bottom, top):
        given = list(bottom) + list(top)
        if given:
            self.python_layer.blobs.xp, self.python_layer.blobs.dtype = given[0].xp, given[0].dtype
        self.python_layer.setup(_views(bottom), _views(top))

    def reshape(self, bottom, top):
        self.python_layer.reshape(_views(bottom), _views(top))

    def forward(self, bottom, top):
        self.python_layer.forward(_views(bottom), _views(top))

    def backward(self, top, propagate_down, bottom):
        self.python_layer.backward(_views(top), list(propagate_down), _views(bottom))
