"""Solvers by Caffe type name (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) and `create_solver`."""
from scaffe.registry import Registry

_SOLVERS = Registry("solver", __name__, lambda: ("sgd", "nesterov", "adagrad", "rmsprop", "adadelta", "adam"))
register = _SOLVERS.register
known_types = _SOLVERS.known_types


def solver_class(type_name):
    cls = _SOLVERS.lookup(type_name)
    if cls is None:
        from scaffe.solvers.solver import SolverError
        raise SolverError(f"unknown solver type {type_name!r}; known types: {', '.join(known_types())}")
    return cls


def create_solver(param, **kwargs):
    """The solver for SolverParameter `param` (its `type`, default "SGD"); kwargs go to Solver."""
    return solver_class(param.type)(param, **kwargs)


from scaffe.solvers.solver import Solver, SolverError, load_weights, read_solver_file, seed_random  # noqa: E402
from scaffe.solvers.lr_policy import learning_rate  # noqa: E402

__all__ = ["Solver", "SolverError", "create_solver", "known_types", "solver_class", "register",
           "learning_rate", "load_weights", "read_solver_file", "seed_random"]
