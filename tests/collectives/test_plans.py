"""The one road's plans: what a signature sees of each kind of buffer argument, and the measured choice
between our algorithm and native MPI (SCAFFE_CHOICE=measured), which every rank must make alike."""
import array
import mmap

import numpy
import pytest
from mpi4py import MPI

import collectives

from collectives.plans import signature
from mpi_harness import run_ok


def test_a_signature_sees_type_dtype_size_and_a_specs_items():
    a = numpy.zeros(4, numpy.float32)
    assert signature(a) == signature(numpy.ones(4, numpy.float32))
    assert signature(a) != signature(numpy.zeros(4, numpy.int32)) != signature(numpy.zeros(5, numpy.float32))
    memory = mmap.mmap(-1, 8)
    spec = [memory, 4, MPI.BYTE]
    assert signature(spec) == signature([memory, 4, MPI.BYTE])
    assert signature(spec) != signature([memory, 8, MPI.BYTE])  # another count
    assert signature(spec) != signature([mmap.mmap(-1, 8), 4, MPI.BYTE])  # another buffer
    grown = bytearray(4)
    before = signature(grown)
    grown.extend(b"1234")
    assert signature(grown) != before  # resized in place
    assert signature(memoryview(a)) == (memoryview, "f", 16)
    assert signature(array.array("d", [1.0])) == (array.array, "d", 8)
    memory.close()
    assert signature(memory) != signature(memory)  # closed: equal to nothing, never found again


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_measured_choice_keeps_the_faster_road_on_every_rank(ranks):
    run_ok(ranks, "measured_choice.py", env={"SCAFFE_CHOICE": "measured", "SCAFFE_RANKS_PER_NODE": 2}, timeout=120)


def test_one_rank_goes_to_mpi_whatever_algorithm_is_forced(monkeypatch):
    """On a communicator of one rank there is nothing to combine: MPI's own call (a copy) serves every call on
    a dtype MPI reduces, even with an algorithm forced, with the same results; float16, which MPI cannot
    reduce, still takes ours."""
    monkeypatch.setenv("SCAFFE_REDUCE_ALGO", "hierarchical")
    monkeypatch.setenv("SCAFFE_ABORT_ON_ERROR", "0")  # the hook is for MPI jobs, not the pytest process
    comm = collectives.Comm(MPI.COMM_SELF.Dup())
    try:
        for dtype in (numpy.float32, numpy.int8, numpy.float16):
            data = numpy.arange(5, dtype=dtype)
            out = numpy.zeros_like(data)
            comm.Reduce(data, out, MPI.SUM, 0)
            assert out.tolist() == data.tolist()
            out[:] = 0
            comm.Ireduce(data, out, MPI.MAX, 0).Wait()
            assert out.tolist() == data.tolist()
            both = data.copy()
            comm.Allreduce(MPI.IN_PLACE, both, MPI.PROD)
            comm.Bcast(both, 0)
            assert both.tolist() == data.tolist()
        # Four calls of each of the three dtypes: the float16 ones alone run our algorithm.
        made = sorted(type(plan).__name__ for lane in comm._lanes for plan in lane.plans.values())
        assert made == ["AlgorithmPlan"] * 4 + ["NativePlan"] * 8, made
    finally:
        comm.Free()


def test_the_overrides_are_set_on_the_communicator_and_a_subclass_keeps_its_own(monkeypatch):
    """Set-up sets each lane's override on the communicator itself (a repeated call runs no frame of ours
    before it); a subclass's own Reduce stays in charge and reaches ours through super(); Free takes them off."""
    monkeypatch.setenv("SCAFFE_ABORT_ON_ERROR", "0")
    seen = []

    class Logged(collectives.Comm):
        def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, stream=None):
            seen.append(op)
            return super().Reduce(sendbuf, recvbuf, op, root, stream)

    plain, logged = collectives.Comm(MPI.COMM_SELF.Dup()), Logged(MPI.COMM_SELF.Dup())
    try:
        data, out = numpy.arange(4, dtype=numpy.float32), numpy.zeros(4, numpy.float32)
        for comm in (plain, logged):
            for _ in range(3):
                out[:] = 0
                comm.Reduce(data, out, MPI.SUM, 0)
                assert out.tolist() == data.tolist()
        assert seen == [MPI.SUM] * 3
        names = ("Reduce", "Ireduce", "Allreduce", "Iallreduce", "Bcast", "Ibcast")
        assert all(name in vars(plain) for name in names)
        assert "Reduce" not in vars(logged) and all(name in vars(logged) for name in names[1:])
        out[:] = 0
        collectives.Comm.Reduce(plain, data, out, MPI.MAX, 0)  # the class's method runs the same lane's
        assert out.tolist() == data.tolist()
    finally:
        plain.Free()
        logged.Free()
    assert not any(name in vars(plain) for name in names)


def test_a_repeated_call_on_the_same_arrays_changed_in_place_is_planned_again(monkeypatch):
    """The lane's last plan serves a call on the same two arrays only while their dtype and size are its own:
    float32 arrays viewed as float16 in place (which MPI cannot reduce) take our algorithm, with the right sum."""
    monkeypatch.setenv("SCAFFE_ABORT_ON_ERROR", "0")
    comm = collectives.Comm(MPI.COMM_SELF.Dup())
    try:
        data, out = numpy.arange(4, dtype=numpy.float32), numpy.zeros(4, numpy.float32)
        comm.Reduce(data, out, MPI.SUM, 0)
        comm.Reduce(data, out, MPI.SUM, 0)
        data.dtype = out.dtype = numpy.float16  # the same objects, eight float16 elements each
        data[:] = numpy.arange(8)
        out[:] = 0
        comm.Reduce(data, out, MPI.SUM, 0)
        assert out.tolist() == list(range(8))
        made = sorted(type(plan).__name__ for lane in comm._lanes for plan in lane.plans.values())
        assert made == ["AlgorithmPlan"], made  # kept under the same two ids, in the native plan's place
    finally:
        comm.Free()


def test_a_spec_emptied_in_place_after_its_plan_gets_the_validations_error(monkeypatch):
    """A native Bcast's plan compares a spec's kinds inline; the same list emptied since is planned again, and
    the full validation says what is wrong (not an IndexError from the comparison)."""
    monkeypatch.setenv("SCAFFE_ABORT_ON_ERROR", "0")
    comm = collectives.Comm(MPI.COMM_SELF.Dup())
    try:
        spec = [mmap.mmap(-1, 8), 4, MPI.BYTE]
        comm.Bcast(spec, 0)
        comm.Bcast(spec, 0)
        spec.clear()
        with pytest.raises(collectives.CollectiveError, match="a buffer spec has 2 to 4 items, got 0"):
            comm.Bcast(spec, 0)
    finally:
        comm.Free()
