"""Caffe's protobuf messages (NetParameter, SolverParameter, Datum, ...) as generated Python classes.

`caffe.proto` here is scaffe's own subset of BVLC Caffe's schema with Caffe's field numbers;
`caffe_pb2.py` is generated from it (see README.md in this folder for how to regenerate).
"""
from . import caffe_pb2

__all__ = ["caffe_pb2"]
