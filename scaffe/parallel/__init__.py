"""Data-parallel training over MPI: one process per device, Caffe's solver on every rank.

`attach(solver, comm, schedule)` hooks a schedule into a solver and its net (see `schedules`):
"scaffe" (S-Caffe: per-layer parameter broadcast overlapped with forward, per-layer gradient reduce
overlapped with backward, the root updates) or "allreduce" (gradients fused into buckets and
allreduced during backward, every rank updates).
"""
from scaffe.parallel.schedules import SCHEDULES, attach

__all__ = ["SCHEDULES", "attach"]
