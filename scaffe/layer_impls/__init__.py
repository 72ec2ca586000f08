"""Layer registry: each layer module registers its class under Caffe's type name."""
import importlib
import pkgutil

_REGISTRY = {}
_loaded = False


def register(cls):
    """Class decorator: registers `cls` under `cls.type` (Caffe's type string, e.g. "Convolution")."""
    if cls.type in _REGISTRY:
        raise ValueError(f"layer type {cls.type!r} registered twice")
    _REGISTRY[cls.type] = cls
    return cls


def _load_all():
    global _loaded
    if not _loaded:
        _loaded = True
        for info in pkgutil.iter_modules(__path__):
            if info.name != "layer":
                importlib.import_module(f"{__name__}.{info.name}")


def known_types():
    _load_all()
    return sorted(_REGISTRY)


def create_layer(param, phase):
    """A layer instance for `param` (a LayerParameter); an unknown type names the known ones."""
    _load_all()
    try:
        cls = _REGISTRY[param.type]
    except KeyError:
        raise ValueError(
            f"layer {param.name!r}: unknown layer type {param.type!r}; known types: {', '.join(known_types())}"
        ) from None
    return cls(param, phase)
