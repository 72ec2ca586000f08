"""BatchReindex and Filter: outputs, shapes and refusals as Caffe's layers and tests define them.
(Their gradients are checked in test_layers_gradients.py.)"""
import numpy
import pytest

from gradient_check import LayerHarness


def test_batch_reindex_gathers_items_and_sums_gradients_of_repeats():
    data = numpy.arange(3 * 2 * 2, dtype=float).reshape(3, 2, 2)
    index = numpy.array([2, 0, 2, 1.9])   # Caffe truncates 1.9 to item 1
    harness = LayerHarness('type: "BatchReindex"', [data, index])
    (top,) = harness.forward()
    numpy.testing.assert_array_equal(top, data[[2, 0, 2, 1]])
    top_diff = numpy.random.default_rng(0).standard_normal(top.shape)
    (bottom_diff, _), _ = harness.backward([top_diff], [True, False])
    numpy.testing.assert_array_equal(bottom_diff, numpy.stack([top_diff[1], top_diff[3], top_diff[0] + top_diff[2]]))


@pytest.mark.parametrize("index,message", [(numpy.array([0, 3.0]), "0..2"), (numpy.array([-1.0]), "0..2")])
def test_batch_reindex_refuses_indices_outside_the_batch(index, message):
    harness = LayerHarness('type: "BatchReindex"', [numpy.zeros((3, 2)), index])
    with pytest.raises(ValueError, match=message):
        harness.forward()


def test_batch_reindex_wants_a_flat_index_blob():
    with pytest.raises(ValueError, match="1 axis"):
        LayerHarness('type: "BatchReindex"', [numpy.zeros((3, 2)), numpy.zeros((2, 1))])


def test_filter_keeps_selected_items_of_every_bottom():
    rng = numpy.random.default_rng(1)
    data, labels = rng.standard_normal((4, 3, 2)), numpy.arange(4.0)
    selector = numpy.array([0, 1, 0, 1.0]).reshape(4, 1, 1)
    harness = LayerHarness('type: "Filter" top: "d" top: "l"', [data, labels, selector], num_tops=2)
    kept_data, kept_labels = harness.forward()
    numpy.testing.assert_array_equal(kept_data, data[[1, 3]])
    numpy.testing.assert_array_equal(kept_labels, [1, 3])
    top_diff = rng.standard_normal((2, 3, 2))
    (data_diff, _, _), _ = harness.backward([top_diff, numpy.zeros(2)], [True, False, False])
    numpy.testing.assert_array_equal(data_diff[[1, 3]], top_diff)
    assert not data_diff[[0, 2]].any()


def test_filter_with_nothing_selected_gives_empty_tops():
    harness = LayerHarness('type: "Filter"', [numpy.ones((3, 2)), numpy.zeros(3)])
    (top,) = harness.forward()
    assert top.shape == (0, 2)


@pytest.mark.parametrize("bottoms,message", [
    ([numpy.ones((3, 2)), numpy.ones((3, 2))], "selector"),
    ([numpy.ones((3, 2)), numpy.ones(4)], "first dimension 4"),
])
def test_filter_refuses_mismatched_bottoms(bottoms, message):
    with pytest.raises(ValueError, match=message):
        LayerHarness('type: "Filter"', bottoms)


def test_filter_cannot_backpropagate_to_the_selector():
    harness = LayerHarness('type: "Filter"', [numpy.ones((3, 2)), numpy.ones(3)])
    harness.forward()
    with pytest.raises(ValueError, match="selector"):
        harness.backward([numpy.ones((3, 2))], [True, True])
