"""`import caffe` as scaffe, for code written for BVLC Caffe: put this folder's parent on PYTHONPATH.

`caffe` becomes the scaffe module itself, and `caffe.X` for any X (caffe.io, caffe.draw, caffe.coord_map,
caffe.proto.caffe_pb2, ...) is the module `scaffe.X`, so each module is loaded once under both names.
"""
import importlib
import importlib.abc
import importlib.util
import sys

import scaffe


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


sys.meta_path.insert(0, _ScaffeAlias())
sys.modules[__name__] = scaffe
