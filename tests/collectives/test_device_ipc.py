"""Device buffers on the direct path (collectives.devices.ipc) across MPI processes, on the CPU stand-in
device, against numpy, exactly (workers/device_ipc.py); a planted missing wait must be caught; two
communicators' threads share a process's registration cache; failures reach every rank; and the pieces
that need no MPI job: the stand-in itself, the registration cache, slices and owners.
"""
import os
from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest

from collectives.devices.peers import PeerMemory
from collectives.devices import ipc
from kernels import _reduce_raw
from kernels.cuda_sources import CudaSource
from collectives.ops import supports
from kernels.reduce import UFUNCS
from mpi_harness import launch, require_ok, run_ok
from stand_ins import cpu_device

ALL = ("--ops", "all", "--dtypes", "all")
EVERY_OP = ("--ops", "all", "--dtypes", "int8,uint16,int64,float16,float32,complex128")
SOME = ("--ops", "sum,max,bxor", "--dtypes", "int8,uint64,float16,float64,complex64")


@pytest.mark.parametrize("ranks,gpus,space", [
    (2, "shared", ALL),  # one kernel at the owner reads both ranks
    (4, "distinct", EVERY_OP),  # four owners, a slice each, writing into the other ranks' buffers
    (4, "pairs", SOME),  # two devices of two ranks
], ids=lambda value: value if isinstance(value, (int, str)) else "")
def test_every_op_and_dtype_on_the_stand_in(ranks, gpus, space):
    run_ok(ranks, "device_ipc.py", "--gpus", gpus, *space, timeout=120)


def test_staged_setting_copies_through_the_host():
    run_ok(2, "device_ipc.py", "--expect", "staged", *SOME, env={"SCAFFE_DEVICE_PATH": "staged"}, timeout=120)


def test_a_comm_argument_picks_the_staged_path_over_the_setting():
    run_ok(2, "device_ipc.py", "--expect", "staged", "--path-argument", "--ops", "sum", "--dtypes", "float32",
           env={"SCAFFE_DEVICE_PATH": "direct"}, timeout=120)


@pytest.mark.parametrize("ranks,gpus,forget", [
    (2, "shared", "caller"), (4, "distinct", "caller"), (2, "pairs", "done"), (4, "shared", "done"),
])
def test_a_missing_wait_gives_wrong_results(ranks, gpus, forget):
    """ForgetfulDevice drops the owners' waits on the other ranks' ready events ("peer"), the wait that
    orders a call after the caller's stream ("caller"), or the host's wait for the kernels before a call
    returns ("done"): the stand-in's delays must make results wrong."""
    job = launch(ranks, "device_ipc.py", "--gpus", gpus, "--forget", forget, timeout=120)
    assert not job.timed_out and job.returncode != 0, job.report()
    assert "elements differ" in job.stderr, job.report()


def test_two_communicators_threads_share_the_registration_cache_safely():
    """The S-Caffe schedule's two communicators call from two threads on buffers freed and allocated
    again: right results, and no mapping closed under the other thread's running kernel."""
    run_ok(2, "device_threads.py", "--rounds", 150, timeout=180)


@pytest.mark.gpu
def test_cupy_buffers_on_the_gpu():
    run_ok(2, "device_ipc.py", "--memory", "cupy", *SOME, timeout=300)


# -- in one process ---------------------------------------------------------------------------------
def test_stand_in_streams_are_asynchronous_and_ordered():
    device = cpu_device.CpuDevice(max_delay_s=5e-3, seed=1)
    first, second = device.new_stream(), device.new_stream()
    buf = device.empty(4, numpy.int32)
    buf.write(numpy.arange(4), first)
    assert not buf.peek().any()  # queued, not done
    done = device.new_event()
    device.record(done, first)
    device.wait(second, done)
    device.copy(device.array((4,), numpy.int32), buf, second)
    out = device.array((4,), numpy.int32)
    device.reduce([out], [buf, buf, buf], "sum", second)
    device.synchronize_stream(second)
    numpy.testing.assert_array_equal(out.peek(), 3 * numpy.arange(4))
    assert device.query(done)


def test_stand_in_memory_opens_by_handle_once_per_live_address():
    owner, other = cpu_device.CpuDevice(seed=2), cpu_device.CpuDevice(seed=3)
    buf = owner.array((8,), numpy.float64)
    buf.write(numpy.arange(8.0))
    owner.default_stream.synchronize()
    handle, base, _, offset = owner.export(buf[3:])
    opened = other.open(handle)
    numpy.testing.assert_array_equal(other.view(opened, offset, 5, numpy.float64).peek(), numpy.arange(3.0, 8.0))
    with pytest.raises(RuntimeError, match="cudaErrorAlreadyMapped"):
        other.open(handle)  # CUDA maps an address range once per process
    other.close(opened)
    other.close(other.open(handle))


def test_a_freed_address_comes_back_with_a_new_handle():
    owner = cpu_device.CpuDevice(seed=6)
    first = owner.array((4,), numpy.int64)
    handle, base, _, _ = owner.export(first)
    del first
    held = [owner.array((4,), numpy.int64) for _ in range(64)]  # freed addresses come back lowest first
    again = [owner.export(b)[0] for b in held if owner.export(b)[1] == base]
    assert len(again) == 1 and again[0] != handle


def _export(owner, buf):
    handle, base, size, offset = owner.export(buf)
    return os.getpid(), base, size, handle, offset


def test_peer_memory_opens_each_allocation_once_and_evicts_the_oldest():
    owner, device = cpu_device.CpuDevice(seed=4), cpu_device.CpuDevice(seed=5)
    buffers = [owner.array((4,), numpy.int64) for _ in range(3)]
    peers = PeerMemory(device, capacity=2)
    for buf in buffers[:2] * 3:
        peers.view(*_export(owner, buf), 4, numpy.int64)
    assert peers.opens == 2
    peers.view(*_export(owner, buffers[2]), 4, numpy.int64)  # evicts buffers[0]'s mapping
    peers.view(*_export(owner, buffers[1]), 4, numpy.int64)
    assert peers.opens == 3
    peers.view(*_export(owner, buffers[0]), 4, numpy.int64)
    assert peers.opens == 4


def test_peer_memory_closes_a_stale_mapping_before_opening_a_reused_address():
    """A peer freed a buffer and got its address again with a new handle (numba's way): the cached
    mapping is closed first, else the stand-in refuses the second mapping, as CUDA does."""
    owner, device = cpu_device.CpuDevice(seed=7), cpu_device.CpuDevice(seed=8)
    peers = PeerMemory(device)
    buf = owner.array((4,), numpy.int64)
    buf.write(numpy.arange(4))
    owner.default_stream.synchronize()
    stale = _export(owner, buf)
    peers.view(*stale, 4, numpy.int64)
    del buf
    held = [owner.array((4,), numpy.int64) for _ in range(64)]  # freed addresses come back lowest first
    buf = next(b for b in held if owner.export(b)[1] == stale[1])
    buf.write(numpy.arange(10, 14))
    owner.default_stream.synchronize()
    fresh = _export(owner, buf)
    assert fresh[1] == stale[1] and fresh[3] != stale[3]
    numpy.testing.assert_array_equal(peers.view(*fresh, 4, numpy.int64).peek(), numpy.arange(10, 14))
    assert peers.opens == 2


def test_slices_cover_the_vector_on_aligned_boundaries():
    for count, itemsize, parts in [(0, 4, 3), (1, 8, 4), (5003, 8, 4), (10 ** 6 + 3, 2, 7)]:
        bounds = [ipc._slice(count, itemsize, parts, i) for i in range(parts)]
        assert bounds[0][0] == 0 and bounds[-1][1] == count
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert all(lo * itemsize % 256 == 0 for lo, hi in bounds if hi > lo)


def test_one_owner_per_device_and_the_root_owns_its_own():
    def records(devices, root):
        table = numpy.zeros(len(devices), dtype=ipc._RECORD)
        table["device"], table["root"] = devices, root
        return table

    assert ipc._owners(records([1, 1, 1, 1], 2)) == [2]
    assert ipc._owners(records([1, 2, 3, 4], 0)) == [0, 1, 2, 3]
    assert ipc._owners(records([1, 1, 2, 2], 1)) == [1, 2]
    assert ipc._owners(records([1, 1, 2, 2], 3)) == [0, 3]


def test_kernel_variants_cover_every_op_and_dtype_and_refuse_nonsense():
    """The variants the compile check builds name every op and every dtype, each under its own name."""
    names = [name for name, _, _ in _reduce_raw.variants()]
    assert len(set(names)) == len(names)
    assert all(any(f"_{op}_" in name for name in names) for op in list(UFUNCS) + ["copy"])
    assert all(any(f"_{dtype.name}_" in name for name in names) for dtype in _reduce_raw.dtypes())
    assert _reduce_raw.variant("sum", numpy.float32, 4, 1)[0] == "scaffe_reduce_sum_float32_k4_m1"
    with pytest.raises(ValueError, match="no kernel"):
        _reduce_raw.variant("sum", numpy.bool_, 2, 1)
    with pytest.raises(ValueError, match="no reduce kernel"):
        _reduce_raw.variant("sum", numpy.float32, 1, 1)


def test_each_kernel_variant_takes_its_arrays_as_pointers_and_the_count():
    name, code, options = _reduce_raw.variant("max", numpy.uint16, 3, 2)
    parameters = CudaSource(name, code, options).parameters
    assert parameters == [("const T*", "in0"), ("const T*", "in1"), ("const T*", "in2"),
                          ("T*", "out0"), ("T*", "out1"), ("long long", "n")]


def test_local_ranks_that_disagree_are_named():
    table = numpy.zeros(3, dtype=ipc._RECORD)
    table["count"] = [10, 10, 10]
    assert ipc._disagreement(table) is None
    table["count"][2], table["root"][1] = 12, 1
    message = ipc._disagreement(table)
    assert "count (10, 10, 12)" in message and "root (0, 1, 0)" in message and "dtype" not in message


def test_the_kernel_has_exactly_the_ops_mpi_defines():
    for dtype in _reduce_raw.dtypes():
        for op in UFUNCS:
            if supports(op, dtype):
                _reduce_raw.variant(op, dtype, 2, 1)
            else:
                with pytest.raises(ValueError, match="no kernel for"):
                    _reduce_raw.variant(op, dtype, 2, 1)


# -- errors: the same one line on every local rank, never a hang -------------------------------------
@pytest.mark.parametrize("step,stall_s", [("export", 60), ("open", 60), ("launch", 0), ("sync", 20)])
def test_a_rank_that_fails_a_step_makes_every_rank_raise_at_once(step, stall_s):
    """Whatever SCAFFE_STALL_S says (0: no limit at all), the failure reaches every rank within seconds."""
    run_ok(2, "device_errors.py", "--mode", step, env={"SCAFFE_STALL_S": stall_s}, timeout=60)


# The two jobs that wait for half of SCAFFE_STALL_S to pass, side by side.
WAITING = {"late": (3, "late"), "never joins": (2, "mixed")}


@pytest.fixture(scope="module")
def waiting_jobs():
    with ThreadPoolExecutor(len(WAITING)) as pool:
        started = {name: pool.submit(launch, ranks, "device_errors.py", "--mode", mode, env={"SCAFFE_STALL_S": 4},
                                     timeout=60) for name, (ranks, mode) in WAITING.items()}
        return {name: job.result() for name, job in started.items()}


def test_ranks_that_gave_up_on_a_late_rank_get_their_buffers_back(waiting_jobs):
    require_ok(waiting_jobs["late"])


def test_ranks_mixing_host_and_device_buffers_are_named_by_the_check():
    run_ok(2, "device_errors.py", "--mode", "mixed", env={"SCAFFE_CHECK": 1}, timeout=60)


def test_ranks_mixing_host_and_staged_device_buffers_pass_the_check():
    run_ok(2, "device_errors.py", "--mode", "mixed", env={"SCAFFE_CHECK": 1, "SCAFFE_DEVICE_PATH": "staged"},
           timeout=60)


def test_a_rank_that_never_joins_ends_the_wait_with_an_error(waiting_jobs):
    job = waiting_jobs["never joins"]
    assert not job.timed_out and job.returncode != 0, job.report()
    assert "did not join" in job.stderr and "SCAFFE_DEVICE_PATH=staged" in job.stderr, job.report()


def test_cupy_arrays_in_host_memory_are_refused_not_passed(cupy_stand_in):
    """The numpy-backed cupy makes host arrays: --memory cupy must say so, not pass every case on the host
    path (why the GPU run read "0 of 31 calls took the direct path": the worker imported this cupy)."""
    job = launch(2, "device_ipc.py", "--memory", "cupy", *SOME, timeout=60)
    assert not job.timed_out and job.returncode != 0, job.report()
    assert "makes arrays in host memory" in job.stderr, job.report()


def test_peer_memory_closes_every_stale_mapping_a_new_allocation_overlaps():
    """Two freed buffers' range comes back as one larger allocation (an OSU sweep's doubling sizes on
    numba): both stale mappings are closed first, else the stand-in refuses the range, as CUDA does."""
    owner, device = cpu_device.CpuDevice(seed=9), cpu_device.CpuDevice(seed=10)
    peers = PeerMemory(device)
    pair = [owner.array((64,), numpy.int32) for _ in range(2)]  # 256 bytes each, side by side
    live = owner.array((64,), numpy.int32)
    stale = [_export(owner, buf) for buf in pair]
    for exported in stale + [_export(owner, live)]:
        peers.view(*exported, 64, numpy.int32)
    assert stale[1][1] == stale[0][1] + 256
    del pair
    held = [owner.array((128,), numpy.int32) for _ in range(64)]  # freed ranges come back lowest first
    wide = next(b for b in held if owner.export(b)[1] == stale[0][1])
    wide.write(numpy.arange(128, dtype=numpy.int32))
    owner.default_stream.synchronize()
    fresh = _export(owner, wide)
    assert fresh[1] == stale[0][1] and fresh[2] == 512
    numpy.testing.assert_array_equal(peers.view(*fresh, 128, numpy.int32).peek(), numpy.arange(128))
    peers.view(*_export(owner, live), 64, numpy.int32)  # still mapped: only the stale ones were closed
    assert (peers.opens, peers.closes) == (4, 2)


class _RegionDevice(cpu_device.CpuDevice):
    """Refuses the next `refusals` opens as CUDA does where it maps a region larger than the allocation
    and a stale mapping holds part of it."""

    refusals = 1

    def open(self, handle):
        if self.refusals:
            self.refusals -= 1
            raise RuntimeError("cudaErrorAlreadyMapped: resource already mapped (planted)")
        return super().open(handle)


def test_peer_memory_closes_the_peers_mappings_when_cuda_still_refuses():
    owner, device = cpu_device.CpuDevice(seed=11), _RegionDevice(seed=12)
    device.refusals = 0
    peers = PeerMemory(device)
    kept = [owner.array((4,), numpy.int64) for _ in range(2)]
    for buf in kept:
        peers.view(*_export(owner, buf), 4, numpy.int64)
    device.refusals = 1
    third = owner.array((4,), numpy.int64)
    peers.view(*_export(owner, third), 4, numpy.int64)  # refused once, then opened after closing the others
    assert (peers.opens, peers.closes) == (3, 2)
    peers.view(*_export(owner, kept[0]), 4, numpy.int64)  # opened again where it was closed
    assert peers.opens == 4
    device.refusals = 2
    with pytest.raises(RuntimeError, match="AlreadyMapped"):
        peers.view(*_export(owner, kept[1]), 4, numpy.int64)  # refused twice: the error is CUDA's


def test_the_registration_cache_closes_when_the_last_communicator_using_it_is_freed():
    from mpi4py import MPI
    owner, device = cpu_device.CpuDevice(seed=13), cpu_device.CpuDevice(seed=14)
    first, second = ipc.NodeIpc(MPI.COMM_SELF), ipc.NodeIpc(MPI.COMM_SELF)
    cache = first.state(device).peers
    assert second.state(device).peers is cache and cache.users == 2
    bufs = [owner.array((4,), numpy.int64) for _ in range(2)]
    with cache.lock:
        for buf in bufs:
            cache.view(*_export(owner, buf), 4, numpy.int64)
    assert len(device._mapped) == 2
    first.free()
    assert (cache.closes, len(device._mapped)) == (0, 2)  # the second communicator may still read them
    second.free()
    assert (cache.users, cache.closes, len(device._mapped)) == (0, 2, 0)
    third = ipc.NodeIpc(MPI.COMM_SELF)  # a later communicator maps what it needs again
    with third.state(device).peers.lock:
        cache.view(*_export(owner, bufs[0]), 4, numpy.int64)
    assert (cache.users, cache.opens, len(device._mapped)) == (1, 3, 1)
    third.free()
    assert len(device._mapped) == 0
