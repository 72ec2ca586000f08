"""scaffe: a Caffe-compatible training library (nets, layers, solvers, data) with a distributed trainer.

`import scaffe` gives pycaffe's interface (scaffe.pycaffe): `scaffe.Net`, `scaffe.get_solver`,
`scaffe.SGDSolver` ..., `scaffe.set_mode_cpu/set_mode_gpu/set_device`, `scaffe.TRAIN`/`scaffe.TEST`,
`scaffe.Timer`, `scaffe.init_log`/`scaffe.log` (pycaffe's function; scaffe's modules import the logging module
scaffe.log by `from scaffe.log import ...`), and
pycaffe's NetSpec (scaffe.net_spec): `scaffe.NetSpec`, `scaffe.layers` (L), `scaffe.params` (P), `scaffe.to_proto`;
`scaffe.Layer` (Python layers), `scaffe.io`, `scaffe.Classifier`, `scaffe.Detector`.
"""
__version__ = "0.1.0"

from scaffe.pycaffe import (TEST, TRAIN, AdaDeltaSolver, AdaGradSolver, AdamSolver, BlobView,  # noqa: E402
                            Net, NesterovSolver, RMSPropSolver, SGDSolver, Solver, Timer, get_solver, has_nccl,
                            init_log, layer_type_list, log, set_device, set_mode_cpu, set_mode_gpu,
                            set_multiprocess, set_random_seed, set_solver_count, set_solver_rank, solver_count,
                            solver_rank)
from scaffe.net_spec import NetSpec, layers, params, to_proto  # noqa: E402
from scaffe import io  # noqa: E402
from scaffe.classifier import Classifier  # noqa: E402
from scaffe.detector import Detector  # noqa: E402
from scaffe.layer_impls.python import Layer  # noqa: E402

__all__ = ["TEST", "TRAIN", "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "BlobView", "Net", "NesterovSolver",
           "RMSPropSolver", "SGDSolver", "Solver", "get_solver", "layer_type_list", "set_device", "set_mode_cpu",
           "set_mode_gpu", "set_random_seed", "NetSpec", "layers", "params", "to_proto",
           "has_nccl", "io", "Classifier", "Detector", "Layer",
           "solver_count", "solver_rank", "set_solver_count", "set_solver_rank", "set_multiprocess",
           "Timer", "init_log", "log"]
