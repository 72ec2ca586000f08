"""The stall inspector's report: one line naming what a waiting rank waits for and what each other rank of
its communicator does, and `silent_ranks`, which reads back the ranks it found lost (the elastic supervisor
leaves their hosts out). No MPI here: a process outside the job reads reports too."""
import re

SILENT = "no answer (frozen, dead or exited): "
_SILENT_RANKS = re.compile(re.escape(SILENT) + r"((?:rank \d+(?:, )?)+)")


def report(rank, op, others, states, stall_s, lost_s=None):
    """The stall report of `rank` on its operation `op` = (comm index, name, number, nbytes, seconds waited),
    from `states`: rank -> its answer, for those of `others` that answered. With `lost_s` the job ends before
    the stall limit, because a rank has not answered for that long."""
    index, name, number, nbytes, waited = op
    joined, not_joined, silent = [], [], []
    for other in others:
        state = states.get(other)
        if state is None:
            silent.append(f"rank {other}")
        elif state["started"].get((index, name), 0) >= number:
            joined.append(f"rank {other}")
        elif state["in_flight"]:
            doing = ", ".join(f"{_label(i, n, k)} for {s:.0f} s" for i, n, k, s in state["in_flight"])
            not_joined.append(f"rank {other} (at {doing})")
        else:
            last = state["started"].get((index, name), 0)
            after = f"after {_label(index, name, last)}" if last else f"before its first {name}"
            not_joined.append(f"rank {other} (in no collective, computing: {after})")
    why = (f"(SCAFFE_STALL_S={stall_s:g})" if lost_s is None
           else f"and a rank of it has not answered for SCAFFE_LOST_S={lost_s:g} s")
    parts = [f"scaffe: rank {rank}: {_label(index, name, number)} ({_size(nbytes)}) has waited {waited:.0f} s {why}"]
    if not_joined:
        parts.append("not joined: " + ", ".join(not_joined))
    if silent:
        parts.append(SILENT + ", ".join(silent))
    if joined:
        parts.append("joined: " + ", ".join(joined))
    if not (not_joined or silent):
        parts.append("every rank has joined it; it is stuck inside")
    return "; ".join(parts) + ". Aborting the job.\n"


def silent_ranks(text):
    """The ranks that the reports in `text` name as not answering (none where it holds no report)."""
    return {int(number) for found in _SILENT_RANKS.findall(text) for number in re.findall(r"\d+", found)}


def _label(index, name, number):
    """How the report names an operation: "Allreduce #12", with its communicator unless it is the first."""
    return f"{name} #{number}" + (f" on communicator {index}" if index else "")


def _size(nbytes):
    if nbytes < 1024:
        return f"{nbytes} B"
    for unit in ("KiB", "MiB", "GiB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}"
