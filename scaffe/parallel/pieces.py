"""How a layer's learnable blobs are cut into the messages a schedule sends: pieces of at most
SCAFFE_PIECE_BYTES, so that a large layer's gradient is reduced, updated and sent back as a pipeline,
and, where small layers follow each other in backward, messages that join them (Messages).

A piece is a run of consecutive elements of the net's parameters: within the solver's flat buffers,
where a layer's blobs follow each other, so a piece may cover the end of the weights and the bias, and
consecutive layers follow each other too, so a message of several small layers is one slice with
nothing copied; without flat buffers (learnable blobs of mixed types), within one blob. The solver
updates a piece by its `segments` (scaffe.solvers.sgd: `update_elements`).

Why 2 MiB: a piece's wire time is what the pipeline adds after the last gradient (one piece up, its
update, the same piece down), and a held piece's round trip is what the next forward of its layer waits
for on the other ranks, which then start their backward that much behind the root: on the modelled bed's
AlexNet at the balance of compute and wire, the S-Caffe schedule took 1.16x the bound with 2 MiB pieces and
1.37x with 4 MiB, the allreduce schedule the same with either (perf/RESULTS.md, "Pieces of 2 MiB"). Each
piece costs a nonblocking collective's few hundred microseconds of Python on the training and progress
threads (AlexNet's fc6 becomes 72 pieces). Why 1 MiB for the least message (the allreduce schedule's least
bucket too): below it those few hundred microseconds are more than its time on a 2 Gbit/s link.
"""
from collectives.settings import positive_int
from scaffe.log import get_logger

log = get_logger(__name__)

PIECE_BYTES = 2 << 20
MESSAGE_BYTES = 1 << 20


def piece_bytes():
    """SCAFFE_PIECE_BYTES: the largest piece of a layer's gradients or parameters (default 2 MiB)."""
    return positive_int("SCAFFE_PIECE_BYTES", PIECE_BYTES)


def message_bytes():
    """SCAFFE_MESSAGE_BYTES: below this, a message of gradients waits for the next layers' to join it
    (default 1 MiB; 1 sends each piece as it comes)."""
    return positive_int("SCAFFE_MESSAGE_BYTES", MESSAGE_BYTES)


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
    `index`, `count`: which piece of its layer it is, of how many (the timeline names them);
    `layers`: the layers whose gradients it holds (several for a message of Messages);
    `span`: (start, stop) in the solver's flat buffers, or None without them."""
    __slots__ = ("segments", "data", "diff", "index", "count", "layers", "span")

    def __init__(self, segments, data, diff, span=None, layers=()):
        self.segments, self.data, self.diff, self.span, self.layers = segments, data, diff, span, layers
        self.index, self.count = 0, 1

    @property
    def key(self):
        """The piece's identity, the same on every rank and every iteration: its span in the flat buffers, or,
        without them, its element ranges (a piece is then within one blob). Its staging buffer, its requests
        and its update are keyed by this; `index` is only a name (every joined message is index 0)."""
        return self.span if self.span is not None else self.segments

    def label(self, carries):
        """What a collective of this piece carries, for the timeline (collectives.events.labelled)."""
        if self.count == 1:
            return carries, self.layers
        return carries, self.layers, (self.index, self.count)


def layer_pieces(solver, pids, max_bytes=None, layer=None):
    """The pieces of learnable blobs `pids` (layer `layer`'s) of `solver`'s net, each of at most
    `max_bytes` (None: one per layer, or one per blob without flat buffers). In the flat buffers they
    are cut from the layer's end, last first, so the one left smaller is the layer's first elements,
    next to the end of the layer before it (whose gradients backward gives next)."""
    if not pids:
        return []
    flat, layers = solver.flat, () if layer is None else (layer,)
    if flat is None:
        blobs = solver.net.learnable_params
        pieces = [piece for pid in pids
                  for piece in _cut(blobs[pid].data.reshape(-1), blobs[pid].diff.reshape(-1),
                                    [(pid, 0, blobs[pid].count)], max_bytes, layers)]
    else:
        start, stop = flat.span(pids)
        segments = [(pid, 0, flat.bounds[pid + 1] - flat.bounds[pid]) for pid in sorted(pids)]
        pieces = _cut(flat.data[start:stop], flat.diff[start:stop], segments, max_bytes, layers, start)[::-1]
    for index, piece in enumerate(pieces):
        piece.index, piece.count = index, len(pieces)
    return pieces


def _cut(data, diff, segments, max_bytes, layers, offset=None):
    """Pieces of the flat views `data` and `diff`, which hold `segments` one after the other, cut from
    the end (`offset`: where the views start in the flat buffers, if they are of them)."""
    size = data.size
    step = size if max_bytes is None else max(1, max_bytes // data.itemsize)
    bounds = [(max(0, stop - step), stop) for stop in range(size, 0, -step)][::-1]
    return [Piece(_segments_within(segments, start, stop), data[start:stop], diff[start:stop],
                  None if offset is None else (offset + start, offset + stop), layers) for start, stop in bounds]


class Messages:
    """Backward's pieces, as they come, joined into messages of at least `least` bytes where they are
    neighbours in the solver's flat buffers (a layer's last piece and the layer before it): each
    message is then one slice of the flat buffers, with nothing copied. Without flat buffers, or with
    `least` 1, every piece is a message."""

    def __init__(self, solver, least):
        self.flat, self.least = solver.flat, least
        self._waiting = []  # pieces of the message being made, last in backward first

    def add(self, pieces, last=False):
        """The messages complete once `pieces` (the next in backward order) are in; `last`: backward is
        over, so whatever waits goes too."""
        done = []
        for piece in pieces:
            if self._waiting and (piece.span is None or piece.span[1] != self._waiting[-1].span[0]):
                done.append(self._message())
            self._waiting.append(piece)
            if sum(p.diff.nbytes for p in self._waiting) >= self.least:
                done.append(self._message())
        if last and self._waiting:
            done.append(self._message())
        return done

    def _message(self):
        pieces, self._waiting = self._waiting, []
        if len(pieces) == 1:
            return pieces[0]
        segments = []
        for pid, start, stop in sorted(segment for piece in pieces for segment in piece.segments):
            if segments and segments[-1][0] == pid and segments[-1][2] == start:
                segments[-1] = (pid, segments[-1][1], stop)
            else:
                segments.append((pid, start, stop))
        start, stop = pieces[-1].span[0], pieces[0].span[1]
        layers = tuple(sorted({layer for piece in pieces for layer in piece.layers}))
        return Piece(tuple(segments), self.flat.data[start:stop], self.flat.diff[start:stop], (start, stop), layers)


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
