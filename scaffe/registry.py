"""Classes by Caffe type name (layers, solvers): each module registers its class as it loads, like
Caffe's REGISTER_LAYER_CLASS; the registry loads the modules the first time a name is looked up."""
import importlib


class Registry:
    """`what` names the kind in messages; `module_names()` lists the modules of `package` to load."""

    def __init__(self, what, package, module_names):
        self.what = what
        self._package = package
        self._module_names = module_names
        self._classes = {}
        self._loaded = False

    def register(self, cls):
        """Class decorator: registers `cls` under `cls.type` (Caffe's type string)."""
        if cls.type in self._classes:
            raise ValueError(f"{self.what} type {cls.type!r} registered twice")
        self._classes[cls.type] = cls
        return cls

    def known_types(self):
        self._load_all()
        return sorted(self._classes)

    def lookup(self, type_name):
        """The class registered as `type_name`, or None."""
        self._load_all()
        return self._classes.get(type_name)

    def _load_all(self):
        if not self._loaded:
            self._loaded = True
            for name in self._module_names():
                importlib.import_module(f"{self._package}.{name}")
