"""The S-Caffe schedule's budget of gradient bytes per backward (scaffe.parallel.deferral)."""
import pytest

from scaffe.parallel import deferral
from scaffe.parallel.deferral import UNLIMITED, Budget


def _measured(budget, monkeypatch, first, arrivals, backward_end, total, starts=None):
    """One backward whose reduces (2 MB each, started at `starts` s, by default all at `first`) are seen
    arriving at `arrivals` s; the budget after it."""
    starts = starts or [first] * len(arrivals)
    moments = iter([*starts, *arrivals, backward_end])
    monkeypatch.setattr(deferral.time, "perf_counter", lambda: next(moments))
    for _ in arrivals:
        budget.started()
    for _ in arrivals:
        budget.arrived(2_000_000)
    budget.backward_done()
    budget.measure(2_000_000 * len(arrivals), total, arrivals[-1] <= backward_end)
    return budget.value


def test_the_measured_budget_is_what_the_wire_carried_during_backward(monkeypatch):
    budget = Budget(None)
    assert budget.value == UNLIMITED  # nothing held until measured
    # 2 MB every 10 ms (200 MB/s), the first arriving 0.11 s after it started (the other rank was late), and
    # not all by the backward's end: what 200 MB/s carries in the 0.596 s from the first start to that end.
    late = [0.11 + 0.01 * k for k in range(60)]
    assert _measured(budget, monkeypatch, 0.0, late, 0.596, 244_000_000) == pytest.approx(119_200_000, abs=10)
    # All 50 arrived 0.1 s before the backward ended: it grows by what 0.1 s carries.
    kept_up = [1.01 + 0.01 * k for k in range(50)]
    assert _measured(budget, monkeypatch, 1.0, kept_up, 1.6, 244_000_000) == pytest.approx(120_000_000, abs=10)
    # Just in time: it still grows by the largest message; past every gradient: nothing is held.
    assert _measured(budget, monkeypatch, 2.0, [2.01 + 0.01 * k for k in range(60)], 2.6, 244_000_000) == 122_000_000
    assert _measured(budget, monkeypatch, 3.0, [3.01 + 0.01 * k for k in range(60)], 3.6, 121_000_000) == UNLIMITED
    # Gradients that came slowly (a 30 ms backward between two of them) left the wire idle meanwhile: that is
    # not its rate.
    budget.value = 0
    assert _measured(budget, monkeypatch, 4.0, [4.01, 4.02, 4.06, 4.07], 4.055, 244_000_000,
                     starts=[4.0, 4.0, 4.05, 4.05]) == pytest.approx(11_000_000, abs=10)
    # A slower measurement (100 MB/s) is believed no more than the fastest, decayed by an iteration.
    believed = 2e8 * (1 - deferral.RATE_DECAY)
    assert _measured(budget, monkeypatch, 5.0, [5.02 + 0.02 * k for k in range(60)], 5.51, 244_000_000) == \
        pytest.approx(believed * 0.51, abs=10)
    # Without two arrivals there is no rate: a budget that kept up grows to twice what was sent.
    assert _measured(Budget(None), monkeypatch, 6.0, [6.01], 6.1, 244_000_000) == UNLIMITED
    fresh = Budget(None)
    fresh.value = 2_000_000
    assert _measured(fresh, monkeypatch, 6.0, [6.01], 6.1, 244_000_000) == 4_000_000
    # A budget of nothing still grows: the wire had nothing to carry during backward.
    fresh.value = 0
    monkeypatch.setattr(deferral.time, "perf_counter", lambda: 7.0)
    fresh.backward_done()
    fresh.measure(0, 244_000_000, True)
    assert fresh.value == deferral.GROWTH_FLOOR


def test_a_carried_budget_leaves_nothing_in_flight_after_backward(monkeypatch):
    """The allreduce schedule's (`carried`): what is in flight when backward ends goes on into the next forward,
    ahead of the held pieces, so the budget aims to leave nothing there."""
    budget = Budget(None, carried=True)
    # As above, the first arriving 0.11 s after it started: before it the wire filled (the way through the hosts,
    # or a late rank), so the budget is its 2 MB and what 200 MB/s carries in the 0.486 s from it to the end.
    late = [0.11 + 0.01 * k for k in range(60)]
    assert _measured(budget, monkeypatch, 0.0, late, 0.596, 244_000_000) == pytest.approx(99_200_000, abs=10)
    # All 50 arrived 0.1 s before the backward ended: it grows by the largest message, however long the wire idled.
    kept_up = [1.01 + 0.01 * k for k in range(50)]
    assert _measured(budget, monkeypatch, 1.0, kept_up, 1.6, 244_000_000) == 102_000_000
    # A slower measurement (100 MB/s): the fastest, decayed, from the first arrival.
    believed = 2e8 * (1 - deferral.RATE_DECAY)
    assert _measured(budget, monkeypatch, 5.0, [5.02 + 0.02 * k for k in range(60)], 5.51, 244_000_000) == \
        pytest.approx(2_000_000 + believed * 0.49, abs=10)


def test_a_set_budget_stays_and_clipping_holds_nothing(monkeypatch):
    budget = Budget(100_000)
    assert _measured(budget, monkeypatch, 0.0, [0.1, 5.0], 0.2, 1_000_000) == 100_000
    assert Budget(100_000, holds=False).value == UNLIMITED
    assert Budget(None, holds=False).value == UNLIMITED


def test_unset_measures_on_a_device_and_holds_nothing_on_the_cpu(monkeypatch):
    monkeypatch.delenv("SCAFFE_BACKWARD_BYTES", raising=False)
    assert deferral.backward_bytes(False) == UNLIMITED and Budget(deferral.backward_bytes(False)).value == UNLIMITED
    assert deferral.backward_bytes(True) is None
    for on_device in (False, True):
        monkeypatch.setenv("SCAFFE_BACKWARD_BYTES", "Measured")
        assert deferral.backward_bytes(on_device) is None
        monkeypatch.setenv("SCAFFE_BACKWARD_BYTES", "none")
        assert deferral.backward_bytes(on_device) == UNLIMITED
        monkeypatch.setenv("SCAFFE_BACKWARD_BYTES", "145000000")
        assert deferral.backward_bytes(on_device) == 145_000_000
