"""Start and end of every collective operation on this rank, counted per name and told to whoever listens.

The communicator reports each overridden call (blocking or not) when it starts running on this rank
and when it has completed. Every `Name` counts its operations (its `tally`), which costs two list
updates per call: the stall inspector samples those counts from its own thread. Listeners (the
training timeline) get each start and end with its time, on the thread that runs the operation, so
they must be quick and must not call MPI.

A small nonblocking call that MPI runs goes back to its caller as MPI's own request (collectives.progress), which
the program waits for with MPI's own calls: nothing of ours sees it end. Where the stall inspector runs, such a
call is counted as started and kept among the `unwaited`, and the inspector's `sweep` counts it finished once
MPI has freed its request (it then reads as null), or, before the inspector would abort for it, once MPI says
it has completed.
"""
import contextlib
import itertools
import threading
import time

# Who hears each start and end (add_listener); never rebound, so the latency path (collectives.plans) can
# test it and count tallies inline when it is empty.
listeners = []
_ids = itertools.count(1)
_context = threading.local()  # .label: what the collectives this thread starts now carry
_names = []  # every Name with a tally of its own (a few per communicator set up)
# Calls whose request went back to the caller as MPI's own, (Name, request) in the order they started; None where
# nobody sweeps them. Callers append; one sweep at a time replaces the entries it took with those it keeps.
_unwaited = None
_unwaited_limit = [64]  # a caller sweeps when there are more: twice what the last sweep kept, at least 64
_sweeping = threading.Lock()


class Name(str):
    """A collective's name as listeners see it ("Allreduce"), which also says on which communicator it runs.

    `comm` is the index of that `collectives.Comm`'s set-up in this process. Communicators are set up
    collectively, in the same order on every rank, so the index names the same communicator on all its
    ranks; the stall inspector matches operations across ranks by (comm, name, how many came before).
    `tally` is [operations started, operations finished, bytes of the last one started]; a labelled copy
    (see `labelled`) shares it. `label` is what the caller said the operation carries, else None.
    """

    label = None

    def __new__(cls, text, comm, label=None, tally=None):
        name = super().__new__(cls, text)
        name.comm = comm
        if tally is None:
            tally = [0, 0, 0]
            _names.append(name)
        name.tally = tally
        if label is not None:
            name.label = label
        return name


def names():
    """Every Name that counts operations, for the stall inspector."""
    return list(_names)


@contextlib.contextmanager
def labelled(label):
    """Collectives this thread starts inside the block carry `label` to the listeners (`name.label`), for
    example what a trainer sends in them; a nonblocking one keeps it when it runs on another thread."""
    previous = getattr(_context, "label", None)
    _context.label = label
    try:
        yield
    finally:
        _context.label = previous


def with_label(name):
    """Name `name` carrying this thread's current label, if there is one."""
    label = getattr(_context, "label", None)
    return name if label is None else Name(name, name.comm, label, name.tally)


def add_listener(listener):
    """`listener.started(op_id, name, nbytes, t)` and `listener.finished(op_id, t)`; t is perf_counter()."""
    if listener not in listeners:
        listeners.append(listener)


def remove_listener(listener):
    if listener in listeners:
        listeners.remove(listener)


def started(name, nbytes):
    """Report that collective `name` (a Name) on `nbytes` bytes starts now; returns what `finished` takes."""
    tally = name.tally
    tally[0] += 1
    tally[2] = nbytes
    if not listeners:
        return None
    op_id = next(_ids)
    now = time.perf_counter()
    for listener in listeners:
        listener.started(op_id, name, nbytes, now)
    return op_id


def finished(name, op_id):
    name.tally[1] += 1
    if op_id is not None and listeners:
        now = time.perf_counter()
        for listener in listeners:
            listener.finished(op_id, now)


def reported(name, nbytes, work, *args):
    """`work(*args)` reported as collective `name`: started before it, finished after (also if it raises)."""
    op_id = started(name, nbytes)
    try:
        return work(*args)
    finally:
        finished(name, op_id)


def sweep_unwaited():
    """From now on, calls handed back as MPI's own requests are counted, and `sweep` finishes them (the stall
    inspector calls it when it starts)."""
    global _unwaited
    if _unwaited is None:
        _unwaited = []


def started_unwaited(name, nbytes, request):
    """Collective `name` on `nbytes` bytes, started as MPI's own `request`, which goes back to the caller as it is.
    Counted only where someone sweeps; a caller that keeps posting sweeps them itself each time they have
    doubled, so that they stay few between the inspector's polls."""
    unwaited = _unwaited
    if unwaited is None:
        return
    tally = name.tally  # `started` inline, as the overrides count theirs: a call more shows on a small repeated call
    tally[0] += 1
    tally[2] = nbytes
    unwaited.append((name, request))
    if len(unwaited) > _unwaited_limit[0]:
        sweep()


def sweep(probe=False):
    """Counts finished each unwaited call whose request MPI has freed (it reads as null) or, with `probe`,
    completed (MPI_Request_get_status, which frees nothing); returns how many."""
    unwaited = _unwaited
    if not unwaited:
        return 0
    kept, done = [], []
    with _sweeping:
        taken = unwaited[:]  # calls started meanwhile are appended after these, and stay
        for entry in taken:  # one look at each request: another thread may be freeing it now
            (kept if entry[1] and not (probe and _completed(entry[1])) else done).append(entry)
        unwaited[:len(taken)] = kept
        _unwaited_limit[0] = max(64, 2 * len(kept))
    for name, _ in done:
        finished(name, None)
    return len(done)


def _completed(request):
    try:
        return request.Get_status()
    except Exception:  # an error it completed with is the waiter's to raise
        return True
