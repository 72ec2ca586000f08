"""Compiled CPU code loaded without numba: numba compiles a function once per host, every process loads its
machine code with llvmlite and calls it through ctypes.

numba's own cache (`cache=True`) costs most of a second in every process that loads from it: importing numba
and building its target context. A job of many ranks pays that at every start, and a test suite of hundreds
of launches pays it hundreds of times; llvmlite alone loads a function in a few milliseconds.

    entry = native.load("collectives.intranode._steps", "reducer", numpy.dtype("float32"))
    entry(out, also, ...)                     # int64 and float arguments: addresses, sizes, codes

`factory(*args)` in `module` returns a Python function and its argument types (numba scalar types); numba
compiles it to its native calling convention with no Python wrapper, and the object code is kept in the
user's cache, keyed by the module's source text, the factory and its arguments, and the CPU. What a factory
compiles must be defined in its own module or in kernels/_views.py (a change elsewhere would not change
the key), allocate nothing and raise nothing: its machine code may name C library functions and, as every
array it makes is a view with no owner, numba's release of an owned array, bound here to a function that
aborts. Code that names anything else is refused when it is compiled, in one line naming the symbol.
"""
import ctypes
import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import pickle
import struct
import tempfile
import threading
import time
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import numpy

# numba's runtime function that its reference counting names, reached only when an owned array is freed.
_NEVER_CALLED = "NRT_MemInfo_call_dtor"
_ABORTS = f"""
declare void @abort()
define void @{_NEVER_CALLED}(ptr %meminfo) {{
  call void @abort()
  unreachable
}}
"""
VIEWS = "kernels._views"  # what every compiled module may use besides its own code: part of every key
_CTYPES = {"i64": ctypes.c_int64, "i32": ctypes.c_int32, "double": ctypes.c_double, "float": ctypes.c_float}
_OK = (0, -2)  # numba's status codes for a normal return (a value, or None)
# The modules whose `native_calls()` name what `python -m kernels.native` compiles ahead, and the float dtypes
# they name (those Caffe's nets train in).
AHEAD = ("collectives.intranode.compiled", "kernels.im2col", "kernels.pooling", "kernels.solver_updates")
FLOATS = (numpy.dtype("float32"), numpy.dtype("float64"))

_loaded = {}  # (module, factory, args) -> Entry
_lock = threading.Lock()
_machine = None


class Entry:
    """One loaded function: call it with its arguments; `address` is its native entry point, for compiled code
    that calls it (`i32 f(ptr, ptr, args...)`, numba's calling convention)."""

    def __init__(self, name, engine, symbol, argument_types):
        self.name = name
        self._engine = engine  # owns the machine code
        self.address = engine.get_function_address(symbol)
        prototype = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                     *[_CTYPES[t] for t in argument_types])
        self._function = prototype(self.address)  # ctypes lets go of the GIL during the call
        self._result = ctypes.create_string_buffer(64)  # nothing returns a value; written only on a failure
        self._error = ctypes.create_string_buffer(64)

    def __call__(self, *args):
        status = self._function(self._result, self._error, *args)
        if status not in _OK:
            raise RuntimeError(f"compiled {self.name} failed (status {status})")


def address(array, dtype, what):
    """Where `array`'s elements start, for an entry that reads them as C-contiguous `dtype` elements; `what`
    names the array in the error."""
    if not array.flags.c_contiguous or array.dtype != dtype:
        raise ValueError(f"{what} must be a C-contiguous {numpy.dtype(dtype).name} array")
    return array.ctypes.data


def load(module, factory, *args):
    """The Entry of `factory(*args)` in `module`: loaded from the cache, or compiled into it first; kept, so
    that a kernel's caller may ask for it at every call."""
    call = (module, factory, args)
    entry = _loaded.get(call)
    if entry is None:
        with _lock:
            entry = _loaded.get(call)
            if entry is None:
                name = f"{factory}({', '.join(str(getattr(a, 'name', a)) for a in args)})"
                entry = _loaded[call] = Entry(name, *_link(_cached(_key(call), lambda: _compile(*call))))
    return entry


def compile_ahead(calls):
    """Compiles into the cache those of `calls` ((module, factory, args) as `load` takes them) that it lacks,
    and returns them. It takes no lock: a process that needs one of them meanwhile compiles it itself rather
    than wait for this one, which may run at a low priority."""
    compiled, folder = [], _folder()
    folder.mkdir(parents=True, exist_ok=True)
    for call in calls:
        path = folder / _key(call)
        if _read(path) is None:
            record = _compile(*call)
            if _read(path) is None:
                _write(path, record)
            compiled.append(call)
    return compiled


def _key(call):
    """What names a call's machine code in the cache: the source of its module and of kernels._views, the
    call itself, numba's and llvmlite's versions, and the CPU."""
    sources = [hashlib.sha256(Path(importlib.util.find_spec(name).origin).read_bytes()).hexdigest()
               for name in (call[0], VIEWS)]
    return hashlib.sha256(repr((sources, call, _versions(), _cpu())).encode()).hexdigest()


def _versions():
    return importlib.metadata.version("numba"), llvmlite.__version__


def _cpu():
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def _folder():
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # no home directory: the machine's temporary folder, per user
        base = Path(tempfile.gettempdir()) / f"scaffe-{os.getuid()}"
    return base / "scaffe" / "native"


def _cached(key, compile_):
    """The compiled record of `key`: read from the cache, or compiled by the first process of the host that
    needs it, under the key's lock, while the others that need it wait and then read what it wrote."""
    folder = _folder()
    path = folder / key
    record = _read(path)
    if record is not None:
        return record
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / "lock", "a")
    except OSError:  # no cache to share (read-only): each process compiles for itself
        return compile_()
    with lock:
        # One byte of the lock file per key, so processes compiling different code do not wait for each
        # other; released when the file closes, or when its holder dies.
        fcntl.lockf(lock, fcntl.LOCK_EX, 1, int(key[:15], 16))
        record = _read(path)
        if record is None:
            record = compile_()
            _write(path, record)
    return record


def _write(path, record):
    """Keeps `record` at `path`, whole or not at all."""
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".partial-", delete=False) as out:
            pickle.dump(record, out)
        os.replace(out.name, path)
    except OSError:  # a full disk, a read-only cache: a later process compiles it again
        pass


def _read(path):
    """The record kept at `path`, or None where there is none or it is damaged (then compiled again over it)."""
    try:
        with open(path, "rb") as stored:
            object_code, symbol, llvm_types = pickle.load(stored)
    except (OSError, EOFError, ValueError, TypeError, pickle.UnpicklingError):
        return None
    return (object_code, symbol, llvm_types) if object_code[:4] == b"\x7fELF" else None


def _compile(module, factory, args):
    """numba's native code of factory(*args): (object code, symbol, LLVM argument types)."""
    from numba import njit
    function, argument_types = getattr(importlib.import_module(module), factory)(*args)
    compiled = njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)(function)
    compiled.compile(tuple(argument_types))
    result = compiled.overloads[tuple(argument_types)]
    symbol = result.fndesc.llvm_func_name
    llvm_types = [str(a.type) for a in result.library.get_function(symbol).arguments][2:]
    _, _, (object_code, _) = result.library.serialize_using_object_code()
    unknown = [t for t in llvm_types if t not in _CTYPES]
    missing = [name for name in _undefined(object_code) if not _resolvable(name)]
    if unknown or missing:
        raise RuntimeError(f"{module}.{factory}{args!r} cannot be loaded without numba: "
                           f"argument types {unknown}, symbols {missing}")
    return object_code, symbol, llvm_types


def _resolvable(name):
    if name == _NEVER_CALLED:
        return True
    try:
        getattr(ctypes.CDLL(None), name)
        return True
    except AttributeError:
        return False


def _undefined(object_code):
    """The undefined symbols of an ELF64 little-endian object file (what the loader must resolve)."""
    shoff, = struct.unpack_from("<Q", object_code, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", object_code, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", object_code, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
            name_at, _, _, section_index = struct.unpack_from("<IBBH", object_code, at)
            if section_index == 0 and name_at:
                end = object_code.index(b"\0", strings + name_at)
                names.append(object_code[strings + name_at:end].decode())
    return names


def _link(record):
    """A fresh execution engine holding the record's machine code, its symbol and argument types."""
    global _machine
    object_code, symbol, llvm_types = record
    if _machine is None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _machine = llvm.Target.from_default_triple().create_target_machine(codemodel="jitdefault")
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(_ABORTS), _machine)
    engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
    engine.finalize_object()
    return engine, symbol, llvm_types


def main():
    """`python -m kernels.native`: compiles ahead every CPU kernel the project loads, so that no job's first
    calls on this host wait for numba (about a second each, a minute in all)."""
    calls = [call for module in AHEAD for call in importlib.import_module(module).native_calls()]
    start = time.perf_counter()
    compiled = compile_ahead(calls)
    print(f"kernels.native: {len(compiled)} of {len(calls)} kernels compiled in {time.perf_counter() - start:.1f} s "
          f"into {_folder()}")


if __name__ == "__main__":
    main()
