"""kernels.native: numba compiles a function once per host; every process, the compiling one included, loads
its machine code with llvmlite alone and calls it."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from kernels import native

TINY = """
import numpy
from numba import carray, types
from numba.extending import intrinsic


@intrinsic
def float64_pointer(typingctx, address):
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
    return types.CPointer(types.float64)(types.int64), codegen


def scaled(factor):
    def scale(out, data, count):
        source = carray(float64_pointer(data), count)
        target = carray(float64_pointer(out), count)
        for i in range(count):
            target[i] = factor * source[i]
    return scale, (types.int64,) * 3


def allocating():
    def fill(count):
        numpy.zeros(count)
    return fill, (types.int64,)


def checking():
    def check(count):
        if count < 0:
            raise ValueError("a negative count")
    return check, (types.int64,)
"""
LOAD = """
import sys
import numpy
sys.path.insert(0, sys.argv[1])
from kernels import native
data, out = numpy.arange(5.0), numpy.zeros(5)
native.load("tiny", "scaled", 3.0)(out.ctypes.data, data.ctypes.data, 5)
assert out.tolist() == [0.0, 3.0, 6.0, 9.0, 12.0], out
print("numba" in sys.modules)
"""


def _cached_env(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    return dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))  # a fresh cache


def test_processes_that_meet_new_code_at_once_compile_it_once_and_later_ones_load_it_without_numba(tmp_path):
    """As every local rank meets the node loop, or a dtype's reduce, at the same call: one process compiles it,
    the rest wait and load what it wrote; none of them but the compiler imports numba."""
    env = _cached_env(tmp_path)
    command = [sys.executable, "-c", LOAD, str(tmp_path)]
    at_once = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    imported = [process.communicate(timeout=120)[0].split() for process in at_once]
    assert all(process.returncode == 0 for process in at_once)
    assert sorted(imported) == [["False"], ["False"], ["True"]], imported
    later = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert later.stdout.split() == ["False"], later.stderr


def test_a_damaged_cache_entry_is_compiled_again(tmp_path, monkeypatch):
    env = _cached_env(tmp_path)
    subprocess.run([sys.executable, "-c", LOAD, str(tmp_path)], env=env, check=True, timeout=120)
    (kept,) = (Path(env["XDG_CACHE_HOME"]) / "scaffe" / "native").glob("[0-9a-f]*")
    kept.write_bytes(kept.read_bytes()[:100])  # cut short, as by a crash of a copy
    again = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path)], env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and again.stdout.split() == ["True"], again.stderr  # compiled again: numba
    assert len(kept.read_bytes()) > 1000


def test_a_factory_argument_is_part_of_the_key(tmp_path, monkeypatch):
    env = _cached_env(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    monkeypatch.syspath_prepend(str(tmp_path))
    data, out = numpy.arange(3.0), numpy.zeros(3)
    for factor in (2.0, -1.0):
        native.load("tiny", "scaled", factor)(out.ctypes.data, data.ctypes.data, 3)
        assert out.tolist() == (factor * data).tolist()


def test_code_that_needs_numbas_runtime_is_refused_in_one_line(tmp_path, monkeypatch):
    env = _cached_env(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match=r"allocating\(\) cannot be loaded without numba: .*NRT_MemInfo_alloc"):
        native.load("tiny", "allocating")


def test_an_entry_that_raises_fails_with_its_name(tmp_path, monkeypatch):
    env = _cached_env(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    monkeypatch.syspath_prepend(str(tmp_path))
    check = native.load("tiny", "checking")
    check(3)
    with pytest.raises(RuntimeError, match=r"^compiled checking\(\) failed \(status 1\)$"):
        check(-1)


def test_the_undefined_symbols_of_an_object_file_are_read_from_its_symbol_table():
    from collectives.intranode import protocol
    record = native._compile("collectives.intranode._steps", "loop", (protocol.DESCRIPTION, 2048))
    assert set(native._undefined(record[0])) <= {"memcpy", "sched_yield", "usleep", "NRT_MemInfo_call_dtor"}
    assert {"sched_yield", "usleep"} <= set(native._undefined(record[0]))


def test_code_compiled_ahead_is_loaded_without_numba(tmp_path, monkeypatch):
    """`python -m kernels.native` compiles kernels before any job needs them (compile_ahead): a process that
    loads one finds it, and what is there already is not compiled again."""
    env = _cached_env(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    monkeypatch.syspath_prepend(str(tmp_path))
    call = ("tiny", "scaled", (3.0,))
    assert native.compile_ahead([call]) == [call]
    assert native.compile_ahead([call]) == []
    loaded = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert loaded.stdout.split() == ["False"], loaded.stderr


def test_what_is_compiled_ahead_is_what_the_kernels_load():
    """The calls `native_calls()` name are those the kernels make (the cache's key is the call's repr)."""
    from collectives.intranode import compiled
    from kernels import im2col, pooling, solver_updates
    ahead = {repr(call) for module in native.AHEAD for call in importlib.import_module(module).native_calls()}
    for dtype in (numpy.float32, numpy.float64):
        x = numpy.ones((1, 1, 6, 6), dtype)
        for window in (2, 3, 5):
            top, mask = pooling.max_pool_forward(x, window, 0, 1, (7 - window,) * 2)
            pooling.max_pool_backward(top, mask, window, 0, 1, x.shape)
            top = pooling.ave_pool_forward(x, window, 0, 1, (7 - window,) * 2)
            pooling.ave_pool_backward(top, window, 0, 1, x.shape)
        im2col.col2im(im2col.im2col(x, 3), x.shape, 3)
        data = numpy.ones(4, dtype)
        solver_updates.update("scaffe_sgd_update", data, data.copy(), (1, 1, 0, 0.1, 0.9), False, (data.copy(),))
    for dtype in (numpy.int16, numpy.uint64, numpy.complex128, numpy.float32):
        compiled._reducer(numpy.zeros(1, dtype).dtype)
    compiled._loop()
    loaded = {repr(call) for call in native._loaded if call[0] != "tiny"}
    assert len(loaded) >= 31 and loaded <= ahead, loaded - ahead
