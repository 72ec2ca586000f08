"""Caffe's learning rate policies (fixed, step, exp, inv, multistep, poly, sigmoid) as one function."""
import math

import numpy

from scaffe.log import get_logger

log = get_logger(__name__)


class LRPolicyError(ValueError):
    """The solver's lr_policy is unknown or misses a parameter it needs."""


def _step(param, it, current_step):
    if param.stepsize <= 0:
        raise LRPolicyError(f"lr_policy \"step\" needs stepsize > 0, got {param.stepsize}")
    if param.gamma < 0:
        raise LRPolicyError(f"lr_policy \"step\" needs gamma >= 0, got {float(param.gamma)}")
    current_step = it // param.stepsize
    return float(param.base_lr) * float(param.gamma) ** current_step, current_step


def _multistep(param, it, current_step):
    if current_step < len(param.stepvalue) and it >= param.stepvalue[current_step]:
        current_step += 1
        log.info("MultiStep Status: Iteration %d, step = %d", it, current_step)
    return float(param.base_lr) * float(param.gamma) ** current_step, current_step


def _poly(param, it, current_step):
    if param.max_iter <= 0:
        raise LRPolicyError(f"lr_policy \"poly\" needs max_iter > 0, got {param.max_iter}")
    return float(param.base_lr) * (1.0 - it / float(param.max_iter)) ** float(param.power), current_step


def _sigmoid(param, it, current_step):
    rate = float(param.base_lr) * (1.0 / (1.0 + math.exp(-float(param.gamma) * (it - float(param.stepsize)))))
    return rate, current_step


# policy -> (param, iteration, current_step) -> (rate, current_step)
POLICIES = {
    "fixed": lambda p, it, step: (float(p.base_lr), step),
    "step": _step,
    "exp": lambda p, it, step: (float(p.base_lr) * float(p.gamma) ** it, step),
    "inv": lambda p, it, step: (float(p.base_lr) * (1.0 + float(p.gamma) * it) ** (-float(p.power)), step),
    "multistep": _multistep,
    "poly": _poly,
    "sigmoid": _sigmoid,
}
LR_POLICIES = tuple(POLICIES)


def learning_rate(param, iteration, current_step=0):
    """(rate, current_step) for SolverParameter `param` at `iteration`, as Caffe's
    SGDSolver::GetLearningRate computes them.

    `current_step` is the solver's step counter: "step" recomputes it from the iteration,
    "multistep" advances it by at most one per call (so it must be called every iteration, as the
    solver does, and it is saved in the solverstate). The rate is rounded to float32 because Caffe
    computes it in its Dtype and users compare printed values.
    """
    policy = POLICIES.get(param.lr_policy)
    if policy is None:
        raise LRPolicyError(f"unknown lr_policy {param.lr_policy!r}; known: {', '.join(LR_POLICIES)}")
    rate, current_step = policy(param, int(iteration), current_step)
    return float(numpy.float32(rate)), current_step
