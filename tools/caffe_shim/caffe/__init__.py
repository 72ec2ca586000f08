"""`import caffe` as scaffe, for code written for BVLC Caffe: put this folder's parent on PYTHONPATH.

`caffe` becomes the scaffe module itself, and `caffe.X` for any X (caffe.io, caffe.draw, caffe.coord_map,
caffe.proto.caffe_pb2, ...) is the module `scaffe.X` (scaffe.caffe_alias), so each module is loaded once
under both names.
"""
import sys

from scaffe.caffe_alias import alias_caffe

# This placeholder gives way to scaffe: the import statement that is running returns sys.modules["caffe"].
del sys.modules[__name__]
alias_caffe()
