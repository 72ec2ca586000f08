"""The S-Caffe schedule's budget of gradient bytes per backward (scaffe.parallel.deferral)."""
from scaffe.parallel import deferral
from scaffe.parallel.deferral import GROWTH_FLOOR, UNLIMITED, Budget


def _iteration(budget, monkeypatch, first, backward_end, last_arrival, sent, total, kept_up):
    """One backward: the first reduce at `first` s, backward over at `backward_end`, measured at `last_arrival`."""
    for moment, call in ((first, budget.started), (backward_end, budget.backward_done)):
        monkeypatch.setattr(deferral.time, "perf_counter", lambda moment=moment: moment)
        call()
    monkeypatch.setattr(deferral.time, "perf_counter", lambda: last_arrival)
    budget.measure(sent, total, kept_up)
    return budget.value


def test_the_budget_is_what_the_wire_carries_during_backward(monkeypatch):
    budget = Budget(None)
    assert budget.value == UNLIMITED  # nothing held until measured
    # 244 MB took 0.93 s on the wire; backward lasted 0.6 s of it: 0.6 / 0.93 of the bytes fit.
    assert _iteration(budget, monkeypatch, 0.0, 0.6, 0.93, 244_000_000, 244_000_000, False) == 157_419_354
    # The wire kept up with what it was given: the budget doubles, then covers everything.
    assert _iteration(budget, monkeypatch, 1.0, 1.6, 1.6, 100_000_000, 244_000_000, True) == 200_000_000
    assert _iteration(budget, monkeypatch, 2.0, 2.6, 2.6, 200_000_000, 244_000_000, True) == UNLIMITED
    # A budget of nothing still grows once the wire keeps up.
    budget.value = 0
    assert _iteration(budget, monkeypatch, 3.0, 3.6, 3.6, 0, 244_000_000, True) == GROWTH_FLOOR


def test_a_set_budget_stays_and_clipping_holds_nothing(monkeypatch):
    budget = Budget(100_000)
    assert _iteration(budget, monkeypatch, 0.0, 0.1, 5.0, 100_000, 1_000_000, False) == 100_000
    assert Budget(100_000, holds=False).value == UNLIMITED
    assert Budget(None, holds=False).value == UNLIMITED


def test_unset_holds_nothing_and_measured_asks_for_the_measurement(monkeypatch):
    monkeypatch.delenv("SCAFFE_BACKWARD_BYTES", raising=False)
    assert deferral.backward_bytes() == UNLIMITED and Budget(deferral.backward_bytes()).value == UNLIMITED
    monkeypatch.setenv("SCAFFE_BACKWARD_BYTES", "Measured")
    assert deferral.backward_bytes() is None
    monkeypatch.setenv("SCAFFE_BACKWARD_BYTES", "145000000")
    assert deferral.backward_bytes() == 145_000_000
