"""collectives.settings: each SCAFFE_* variable's default, value and one-line error."""
import pytest

from collectives import settings


def test_defaults(monkeypatch):
    for name in ("SCAFFE_REDUCE_ALGO", "SCAFFE_CHUNK_BYTES", "SCAFFE_SHM_CHUNK_BYTES", "SCAFFE_RANKS_PER_NODE",
                 "SCAFFE_CHECK", "SCAFFE_STALL_S", "SCAFFE_GPU", "SCAFFE_CUDA_AWARE", "SCAFFE_ABORT_ON_ERROR", "SCAFFE_DEVICE_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert settings.reduce_algo(["native", "tree"]) is None
    assert settings.chunk_bytes() == 1 << 20
    assert [settings.shm_chunk_bytes(n, compiled=False) for n in (1, 2, 16, 64)] == [1 << 20, 512 << 10, 64 << 10,
                                                                                     64 << 10]
    assert [settings.shm_chunk_bytes(n, compiled=True) for n in (1, 2, 4, 8)] == [256 << 10, 128 << 10, 64 << 10,
                                                                                  64 << 10]
    assert settings.ranks_per_node() is None and settings.check() is False
    assert settings.stall_seconds() == 60 and settings.gpu(2) is None and settings.cuda_aware_override() is None
    assert settings.abort_on_error() is True and settings.device_path() == "direct"


@pytest.mark.parametrize("name,value,read,expected", [
    ("SCAFFE_REDUCE_ALGO", " Tree ", lambda: settings.reduce_algo(["native", "tree"]), "tree"),
    ("SCAFFE_SHM_CHUNK_BYTES", "2048", lambda: settings.shm_chunk_bytes(4, compiled=False), 2048),
    ("SCAFFE_SHM_CHUNK_BYTES", "2048", lambda: settings.shm_chunk_bytes(4, compiled=True), 2048),
    ("SCAFFE_RANKS_PER_NODE", "2", settings.ranks_per_node, 2),
    ("SCAFFE_CHECK", "yes", settings.check, True),
    ("SCAFFE_CHECK", "0", settings.check, False),
    ("SCAFFE_GPU", "1", lambda: settings.gpu(2), 1),
    ("SCAFFE_CUDA_AWARE", "0", settings.cuda_aware_override, False),
    ("SCAFFE_ABORT_ON_ERROR", "0", settings.abort_on_error, False),
    ("SCAFFE_DEVICE_PATH", " Staged", settings.device_path, "staged"),
])
def test_values(monkeypatch, name, value, read, expected):
    monkeypatch.setenv(name, value)
    assert read() == expected


@pytest.mark.parametrize("name,value,read,message", [
    ("SCAFFE_REDUCE_ALGO", "ring", lambda: settings.reduce_algo(["tree", "native"]),
     "SCAFFE_REDUCE_ALGO='ring' is not one of native, tree"),
    ("SCAFFE_CHUNK_BYTES", "1MiB", settings.chunk_bytes, "SCAFFE_CHUNK_BYTES must be a positive integer, got '1MiB'"),
    ("SCAFFE_GPU", "2", lambda: settings.gpu(2), "SCAFFE_GPU='2': this node has GPUs 0..1"),
    ("SCAFFE_CUDA_AWARE", "yes", settings.cuda_aware_override, "SCAFFE_CUDA_AWARE must be 0 or 1, got 'yes'"),
    ("SCAFFE_DEVICE_PATH", "ipc", settings.device_path, "SCAFFE_DEVICE_PATH must be direct or staged, got 'ipc'"),
])
def test_errors_name_the_variable(monkeypatch, name, value, read, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        read()
    assert str(raised.value) == message


def test_node_waits_nap_longer_where_waits_nap(monkeypatch):
    """The node protocol's waits (collectives.intranode.wait) nap NAP_US; under SCAFFE_WAIT=nap[:MS] each nap
    is twice the last up to the longest it allows, so a peer that computes for long is waited for with a
    few wake-ups (the modelled bed's 16 ranks were busy 0.64 of the CPU at any dilation, napping 20 us)."""
    from collectives import waiting
    from collectives.intranode import wait
    monkeypatch.setattr(waiting, "_policy", lambda: ("nap", 0.001))
    naps = wait._naps()
    assert [round(next(naps) * 1e6) for _ in range(8)] == [20, 40, 80, 160, 320, 640, 1000, 1000]
    assert wait.longest_nap_us() == 1000
    # Before napping a wait yields as often as an MPI wait: its own 2000 yields kept the modelled bed's CPU busy.
    assert wait.yields() == waiting.YIELDS < wait.YIELDS
    monkeypatch.setattr(waiting, "_policy", lambda: ("spin", None))
    naps = wait._naps()
    assert wait.longest_nap_us() == wait.NAP_US and {round(next(naps) * 1e6) for _ in range(4)} == {wait.NAP_US}
    assert wait.yields() == wait.YIELDS
