"""Pieces and messages: how a schedule cuts a net's gradients (scaffe.parallel.pieces), on the CPU solver's
flat buffers."""
import numpy

from perf.bench_train import make_solver
from scaffe.parallel.pieces import Messages, layer_pieces


def _backward_messages(solver, piece_bytes, least):
    net, messages = solver.net, Messages(solver, least)
    ready = [layer_id for layer_id in reversed(range(len(net.layers))) if net.grads_ready_at(layer_id)]
    out = []
    for layer_id in ready:
        out += messages.add(layer_pieces(solver, net.grads_ready_at(layer_id), piece_bytes, layer_id),
                            last=layer_id == ready[-1])
    return out


def test_small_layers_share_a_message_that_is_one_slice_of_the_flat_buffers():
    solver, _ = make_solver("lenet")
    net, flat = solver.net, solver.flat
    names = [layer.name for layer in net.layers]
    # LeNet's gradients in backward order: ip2 20 kB, ip1 1.6 MB, conv2 100 kB, conv1 2 kB.
    joined = _backward_messages(solver, 4 << 20, 1 << 20)
    assert [[names[k] for k in m.layers] for m in joined] == [["ip1", "ip2"], ["conv1", "conv2"]]
    # One piece per message; 60 kB pieces joined up to 1 MiB; every piece alone.
    for piece_bytes, least in ((4 << 20, 1), (60000, 1 << 20), (60000, 1)):
        messages = _backward_messages(solver, piece_bytes, least)
        assert all(m.diff.nbytes >= least for m in messages[:-1])
        spans = sorted(m.span for m in messages)
        assert spans[0][0] == 0 and spans[-1][1] == flat.diff.size
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # each element in exactly one message
        for m in messages:
            start, stop = m.span
            assert numpy.shares_memory(m.diff, flat.diff) and m.diff.size == stop - start
            assert m.diff.__array_interface__["data"][0] == flat.diff[start:].__array_interface__["data"][0]
            assert sum(b - a for _, a, b in m.segments) == stop - start
            assert flat.elements(m.segments) == m.span
    assert len(_backward_messages(solver, 60000, 1)) == 1 + 27 + 2 + 1


def test_joined_segments_update_as_the_pieces_would():
    """The root updates a message by its segments: the same as each of its pieces in turn."""
    one, _ = make_solver("lenet")
    other, _ = make_solver("lenet")
    for solver in (one, other):
        solver.flat.diff[...] = numpy.random.RandomState(3).standard_normal(solver.flat.diff.size) * 1e-2
    for message in _backward_messages(one, 60000, 1 << 20):
        one.update_elements(message.segments, 0.01)
    for piece in _backward_messages(other, 60000, 1):
        other.update_elements(piece.segments, 0.01)
    numpy.testing.assert_array_equal(one.flat.data, other.flat.data)
    numpy.testing.assert_array_equal(one.history[2], other.history[2])
