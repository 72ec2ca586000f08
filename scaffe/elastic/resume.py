"""Training resumed from a commit at any rank count, on the committed trajectory.

The global batch stays the commit's (ranks x per-rank batch x iter_size): the prototxt's per-rank batch with
the iter_size that makes it up where one does, else one pass of global batch / ranks per rank. Every data
reader starts where the committed ranks' next global batch starts, so each iteration reads the samples it
would have read; the iteration, the lr policy's step and the history are the commit's. At the committed rank
count the ranks also take their random states back, and the run goes on bit for bit as uninterrupted; at
another, the same samples' gradients are summed in another order (and ranks beyond the committed ones draw
fresh random numbers).
"""
from scaffe.elastic.state import Commit, data_readers, restore_rank_state
from scaffe.log import get_logger
from scaffe.solvers.solver import SolverError

log = get_logger(__name__)


def batch_plan(global_batch, ranks, batch):
    """(per-rank batch, iter_size) with ranks x batch x iter_size == `global_batch`, keeping the per-rank `batch`
    where an iter_size makes it up; None where no whole per-rank batch does."""
    if global_batch % (ranks * batch) == 0:
        return batch, global_batch // (ranks * batch)
    if global_batch % ranks == 0:
        return global_batch // ranks, 1
    return None


def resume_from_commit(solver, path, rank, size):
    """Puts `solver` (built, before training and before a schedule is attached) where commit `path` left off, as
    rank `rank` of `size`; returns the Commit."""
    commit = Commit(path)
    meta = commit.meta
    global_batch = int(meta["global_batch"])
    plan = batch_plan(global_batch, size, solver.net.batch_size)
    if plan is None:
        raise SolverError(f"{path}: cannot resume on {size} ranks: the commit's global batch {global_batch} is not "
                          f"{size} x a whole per-rank batch; use a rank count that divides {global_batch}")
    batch, iter_size = plan
    log.info("Resuming from commit %s at iteration %d on %d rank(s): global batch %d = %d per rank x %d ranks x "
             "iter_size %d (committed: %d per rank x %d ranks x iter_size %d)", commit.path, commit.iteration, size,
             global_batch, batch, size, iter_size, meta["batch"], meta["ranks"], meta["iter_size"])
    solver.param.iter_size = iter_size
    if batch != solver.net.batch_size:
        _resize_batch(solver.net, batch, path)
    solver.restore(commit.state_path, model=commit.model_path)
    restore_rank_state(solver, commit.ranks, rank)
    return commit


def _resize_batch(net, batch, path):
    """Every data reader of `net` delivers batches of `batch` (before its first forward)."""
    for record in net.layer_records:
        if record.layer in data_readers(net):
            record.layer.batch_size = batch
            for top in record.tops:
                top.reshape((batch,) + tuple(top.shape[1:]))
    net.reshape()
    if net.batch_size != batch:
        raise SolverError(f"{path}: resuming needs a per-rank batch of {batch}, and only Data layers can change "
                          f"theirs; this net's first source gives {net.batch_size}")
