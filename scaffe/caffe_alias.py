"""`caffe` as a second name of scaffe, so code written for BVLC Caffe (scripts through tools/caffe_shim, the
modules of Python layers under `scaffe train`) gets scaffe from `import caffe` and `caffe.X` (caffe.io,
caffe.proto.caffe_pb2, ...) from `scaffe.X`, each module loaded once under both names."""
import importlib
import importlib.abc
import importlib.util
import sys


class _ScaffeAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `caffe.X` and loads it as the already-imported (or now imported) `scaffe.X`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("caffe.") and importlib.util.find_spec("s" + fullname) is not None:
            return importlib.util.spec_from_loader(fullname, self)
        return None  # not caffe's, or a module scaffe lacks: Python's own "No module named" error

    def create_module(self, spec):
        return importlib.import_module("s" + spec.name)

    def exec_module(self, module):
        pass  # scaffe.X ran when create_module imported it


def alias_caffe():
    """Makes `import caffe` give scaffe in this process (again: nothing more). A `caffe` module already
    imported stays: that is BVLC Caffe itself, which a user loaded on purpose."""
    if "caffe" in sys.modules:
        return
    # Imported here, not at the top: scaffe's own package imports this module while it loads.
    sys.modules["caffe"] = importlib.import_module("scaffe")
    if not any(isinstance(finder, _ScaffeAlias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ScaffeAlias())
