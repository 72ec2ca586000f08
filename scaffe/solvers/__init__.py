"""Solvers by Caffe type name (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) and `create_solver`."""
import importlib

_REGISTRY = {}
_MODULES = ("sgd", "nesterov", "adagrad", "rmsprop", "adadelta", "adam")


def register(cls):
    """Class decorator: registers a Solver subclass under its `type` (Caffe's solver type string)."""
    if cls.type in _REGISTRY:
        raise ValueError(f"solver type {cls.type!r} registered twice")
    _REGISTRY[cls.type] = cls
    return cls


def _load_all():
    for name in _MODULES:
        importlib.import_module(f"{__name__}.{name}")


def known_types():
    _load_all()
    return sorted(_REGISTRY)


def solver_class(type_name):
    _load_all()
    try:
        return _REGISTRY[type_name]
    except KeyError:
        from scaffe.solvers.solver import SolverError
        raise SolverError(f"unknown solver type {type_name!r}; known types: {', '.join(known_types())}") from None


def create_solver(param, **kwargs):
    """The solver for SolverParameter `param` (its `type`, default "SGD"); kwargs go to Solver."""
    return solver_class(param.type)(param, **kwargs)


from scaffe.solvers.solver import Solver, SolverError, load_weights, read_solver_file, seed_random  # noqa: E402
from scaffe.solvers.lr_policy import learning_rate  # noqa: E402

__all__ = ["Solver", "SolverError", "create_solver", "known_types", "solver_class", "register",
           "learning_rate", "load_weights", "read_solver_file", "seed_random"]
