"""scaffe: a Caffe-compatible training library (nets, layers, solvers, data) with a distributed trainer."""
__version__ = "0.1.0"
