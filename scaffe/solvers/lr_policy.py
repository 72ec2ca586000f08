"""Caffe's learning rate policies (fixed, step, exp, inv, multistep, poly, sigmoid) as one function."""
import math

import numpy

from scaffe.log import get_logger

log = get_logger(__name__)

LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


class LRPolicyError(ValueError):
    """The solver's lr_policy is unknown or misses a parameter it needs."""


def learning_rate(param, iteration, current_step=0):
    """(rate, current_step) for SolverParameter `param` at `iteration`, as Caffe's
    SGDSolver::GetLearningRate computes them.

    `current_step` is the solver's step counter: "step" recomputes it from the iteration,
    "multistep" advances it by at most one per call (so it must be called every iteration, as the
    solver does, and it is saved in the solverstate). The rate is rounded to float32 because Caffe
    computes it in its Dtype and users compare printed values.
    """
    policy = param.lr_policy
    base = float(param.base_lr)
    gamma = float(param.gamma)
    power = float(param.power)
    it = int(iteration)
    if policy == "fixed":
        rate = base
    elif policy == "step":
        if param.stepsize <= 0:
            raise LRPolicyError(f"lr_policy \"step\" needs stepsize > 0, got {param.stepsize}")
        if gamma < 0:
            raise LRPolicyError(f"lr_policy \"step\" needs gamma >= 0, got {gamma}")
        current_step = it // param.stepsize
        rate = base * gamma ** current_step
    elif policy == "exp":
        rate = base * gamma ** it
    elif policy == "inv":
        rate = base * (1.0 + gamma * it) ** (-power)
    elif policy == "multistep":
        if current_step < len(param.stepvalue) and it >= param.stepvalue[current_step]:
            current_step += 1
            log.info("MultiStep Status: Iteration %d, step = %d", it, current_step)
        rate = base * gamma ** current_step
    elif policy == "poly":
        if param.max_iter <= 0:
            raise LRPolicyError(f"lr_policy \"poly\" needs max_iter > 0, got {param.max_iter}")
        rate = base * (1.0 - it / float(param.max_iter)) ** power
    elif policy == "sigmoid":
        rate = base * (1.0 / (1.0 + math.exp(-gamma * (it - float(param.stepsize)))))
    else:
        raise LRPolicyError(f"unknown lr_policy {policy!r}; known: {', '.join(LR_POLICIES)}")
    return float(numpy.float32(rate)), current_step
