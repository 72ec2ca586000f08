"""How a layer's learnable blobs are cut into the messages a schedule sends: pieces of at most
SCAFFE_PIECE_BYTES, so that a large layer's gradient is reduced, updated and sent back as a pipeline.

A piece is a run of consecutive elements of the layer's parameters: on the CPU within one blob (each
blob is an array of its own), on a GPU within the solver's flat buffers, where a layer's blobs follow
each other, so a piece may cover the end of the weights and the bias. The solver updates a piece by its
`segments` (scaffe.solvers.sgd: `update_elements`).

Why 4 MiB: a piece's wire time is what the pipeline adds after the last gradient (one piece up, its
update, the same piece down): 16 ms on the 2.1 Gbit/s link of the AlexNet measurement in
perf/RESULTS.md, under 2% of its 0.93 s of gradients, while each piece costs a nonblocking
collective's few hundred microseconds of Python on the training and progress threads (AlexNet's fc6
becomes 36 pieces). It is also the allreduce schedule's bucket size.
"""
from collectives.settings import positive_int
from scaffe.log import get_logger

log = get_logger(__name__)

PIECE_BYTES = 4 << 20


def piece_bytes():
    """SCAFFE_PIECE_BYTES: the largest message of a layer's gradients or parameters (default 4 MiB)."""
    return positive_int("SCAFFE_PIECE_BYTES", PIECE_BYTES)


def updates_by_piece(solver, rank):
    """Whether a schedule may update each piece as its sum arrives: not when the solver clips gradients,
    which needs their global norm first (the root's log says so once)."""
    if solver.param.clip_gradients < 0:
        return True
    if rank == 0:
        log.info("clip_gradients needs the global gradient norm: the update waits for every piece of every "
                 "layer (pieces still travel; the update does not overlap them)")
    return False


class Piece:
    """Elements of a layer's parameters that travel as one message.

    `segments`: (learnable id, start, stop) element ranges of the blobs it covers, in order;
    `data`, `diff`: flat views of those elements' parameters and gradients (what MPI sends);
    `index`, `count`: which piece of its layer it is, of how many (the timeline names them)."""
    __slots__ = ("segments", "data", "diff", "index", "count")

    def __init__(self, segments, data, diff):
        self.segments, self.data, self.diff = segments, data, diff
        self.index, self.count = 0, 1

    def label(self, carries, layer_id):
        """What a collective of this piece carries, for the timeline (collectives.events.labelled)."""
        if self.count == 1:
            return carries, (layer_id,)
        return carries, (layer_id,), (self.index, self.count)


def layer_pieces(solver, pids, max_bytes=None):
    """The pieces of learnable blobs `pids` (one layer's) of `solver`'s net, in order, each of at most
    `max_bytes` (None: one piece per blob, or one per layer where the solver keeps flat buffers)."""
    if not pids:
        return []
    flat = solver.flat
    if flat is None:
        blobs = solver.net.learnable_params
        pieces = [piece for pid in pids
                  for piece in _cut(blobs[pid].data.reshape(-1), blobs[pid].diff.reshape(-1),
                                    [(pid, 0, blobs[pid].count)], max_bytes)]
    else:
        start, stop = flat.span(pids)
        segments = [(pid, 0, flat.bounds[pid + 1] - flat.bounds[pid]) for pid in sorted(pids)]
        pieces = _cut(flat.data[start:stop], flat.diff[start:stop], segments, max_bytes)
    for index, piece in enumerate(pieces):
        piece.index, piece.count = index, len(pieces)
    return pieces


def _cut(data, diff, segments, max_bytes):
    """Pieces of the flat views `data` and `diff`, which hold `segments` one after the other."""
    size = data.size
    step = size if max_bytes is None else max(1, max_bytes // data.itemsize)
    return [Piece(_segments_within(segments, start, min(start + step, size)),
                  data[start:start + step], diff[start:start + step]) for start in range(0, size, step)]


def _segments_within(segments, start, stop):
    """The parts of `segments` (laid end to end from element 0) that fall in [start, stop)."""
    out, offset = [], 0
    for param_id, first, last in segments:
        length = last - first
        low, high = max(start, offset), min(stop, offset + length)
        if low < high:
            out.append((param_id, first + low - offset, first + high - offset))
        offset += length
    return tuple(out)
