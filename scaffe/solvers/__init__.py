"""Solvers by Caffe type name (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) and `create_solver`."""
from scaffe.registry import Registry
from scaffe.solvers.lr_policy import learning_rate
from scaffe.solvers.solver import Solver, SolverError, load_weights, read_solver_file, seed_random

_SOLVERS = Registry("solver", __name__, lambda: ("sgd", "nesterov", "adagrad", "rmsprop", "adadelta", "adam"))
register = _SOLVERS.register
known_types = _SOLVERS.known_types


def solver_class(type_name):
    cls = _SOLVERS.lookup(type_name)
    if cls is None:
        raise SolverError(f"unknown solver type {type_name!r}; known types: {', '.join(known_types())}")
    return cls


def create_solver(param, **kwargs):
    """The solver for SolverParameter `param` (its `type`, default "SGD"); kwargs go to Solver."""
    return solver_class(param.type)(param, **kwargs)


def solver_from_file(path, **kwargs):
    """The solver described by prototxt `path`, with Caffe's snapshot_prefix defaults applied."""
    return create_solver(read_solver_file(path), source=path, **kwargs)


__all__ = ["Solver", "SolverError", "create_solver", "solver_from_file", "known_types", "solver_class", "register",
           "learning_rate", "load_weights", "read_solver_file", "seed_random"]
