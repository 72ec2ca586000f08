"""The stand-in's device array: a numpy array behind a wall that only explicit copies cross, as in cupy.

Every rule here is one real cupy enforces (cupy/_core/core.pyx, _kernel.pyx, _scalar.pyx), so code that
runs against the stand-in does not lean on a conversion cupy would refuse:
- `numpy.asarray(x)`, `x.__array__()`, `memoryview(x)`: TypeError; `.get()` / `cupy.asnumpy` copy.
- kernel arguments (ufuncs and every routine) are device arrays or scalars (Python or numpy scalars);
  a numpy array or a list is a TypeError "Unsupported type".
- `x[...] = host` with a non-scalar numpy array is a ValueError (cupy's fill refuses it).
- reductions and integer indexing give 0-d device arrays, never host scalars.
- `float(x)`, `int(x)`, `bool(x)`, `x.item()`, `x.tolist()`, `repr(x)`, `str(x)`, `format(x)` work as in
  cupy (through `.get()`), and like every device-to-host copy they are counted in `_stand_in.counters`.
"""
import numpy

from cupy import _stand_in

_SCALAR_TYPES = (bool, int, float, complex, numpy.generic)
# What makes views, not kernels: no launch is counted for these.
_VIEWS = frozenset(("broadcast_to", "diagonal", "expand_dims", "moveaxis", "ravel", "reshape", "split", "squeeze",
                    "swapaxes", "transpose", "view"))
# What cupy computes through cuBLAS, which cupy refuses to call on a capturing stream.
_CUBLAS = frozenset(("dot", "einsum", "matmul", "tensordot"))
CUBLAS_CAPTURE_ERROR = "calling cuBLAS API during stream capture is currently unsupported"


def refuse_cublas_under_capture():
    """cupy's cublas.setStream raises this on a capturing stream, before every cuBLAS call."""
    if _stand_in.capturing() is not None:
        raise NotImplementedError(CUBLAS_CAPTURE_ERROR)


def _unsupported(value):
    return TypeError(f"Unsupported type {type(value)}")


def to_host_operand(value):
    """A kernel argument as numpy sees it: a device array's storage or a scalar; anything else is refused."""
    if isinstance(value, ndarray):
        return value._array
    if isinstance(value, _SCALAR_TYPES) and not isinstance(value, numpy.ndarray):
        return value
    raise _unsupported(value)


def unwrap_nested(value):
    """Arguments of non-elementwise routines: device arrays (also inside lists/tuples), shapes, axes,
    dtypes and scalars pass; a numpy array anywhere is refused as cupy refuses it."""
    if isinstance(value, ndarray):
        return value._array
    if isinstance(value, numpy.ndarray):
        raise _unsupported(value)
    if isinstance(value, (list, tuple)):
        return type(value)(unwrap_nested(v) for v in value)
    return value


def wrap(result):
    """numpy results back on the device; numpy scalars become 0-d device arrays as cupy returns them."""
    if isinstance(result, numpy.ndarray):
        return ndarray._from_host_storage(result)
    if isinstance(result, numpy.generic):
        return ndarray._from_host_storage(numpy.asarray(result))
    if isinstance(result, tuple):
        return tuple(wrap(r) for r in result)
    return result


def device_routine(numpy_function, name=None):
    """A cupy routine computed by `numpy_function` on the arrays' storage."""
    launches = (name or numpy_function.__name__) not in _VIEWS
    cublas = (name or numpy_function.__name__) in _CUBLAS

    def routine(*args, **kwargs):
        if cublas:
            refuse_cublas_under_capture()
        operands = [unwrap_nested(a) for a in args]
        keywords = {k: unwrap_nested(v) for k, v in kwargs.items()}

        def compute():
            return numpy_function(*operands, **keywords)
        return wrap(_stand_in.run(compute) if launches else _stand_in.view(compute))
    routine.__name__ = name or numpy_function.__name__
    routine.__qualname__ = routine.__name__
    routine.__module__ = "cupy"
    return routine


def _out_operand(out):
    if out is None:
        return None
    if isinstance(out, tuple):
        return tuple(_out_operand(o) for o in out)
    if not isinstance(out, ndarray):
        raise TypeError(f"Output arguments must be cupy.ndarray, not {type(out)}")
    return out._array


class ufunc:
    """A cupy ufunc: device arrays and scalars in, device arrays out (`out=` must be a device array)."""

    def __init__(self, numpy_ufunc):
        self._ufunc = numpy_ufunc
        self.__name__ = numpy_ufunc.__name__
        self.nin = numpy_ufunc.nin
        self.nout = numpy_ufunc.nout

    def __call__(self, *args, out=None, dtype=None, casting="same_kind"):
        operands = [to_host_operand(a) for a in args]
        kwargs = {"casting": casting}
        if dtype is not None:
            kwargs["dtype"] = dtype
        if out is not None:
            kwargs["out"] = _out_operand(out)
        result = _stand_in.run(lambda: self._ufunc(*operands, **kwargs))
        return out if out is not None else wrap(result)

    def at(self, a, indices, b=None):
        if not isinstance(a, ndarray):
            raise _unsupported(a)
        args = () if b is None else (to_host_operand(b),)
        index = _index(indices)
        _stand_in.run(lambda: self._ufunc.at(a._array, index, *args))

    def reduce(self, a, axis=0, dtype=None, out=None, keepdims=False):
        if not isinstance(a, ndarray):
            raise _unsupported(a)
        target = _out_operand(out)
        result = _stand_in.run(lambda: self._ufunc.reduce(a._array, axis=axis, dtype=dtype, out=target,
                                                          keepdims=keepdims))
        return out if out is not None else wrap(result)

    def __repr__(self):
        return f"<ufunc '{self.__name__}'>"


ufunc.__module__ = "cupy"


def _index(key):
    """An index as numpy takes it. cupy copies host index arrays and lists to the device itself
    (_routines_indexing._prepare_slice_list), so numpy arrays are allowed here, unlike in kernels. A
    boolean mask costs a host sync in cupy (it reads the number of selected elements back), so it is counted."""
    parts = key if isinstance(key, tuple) else (key,)
    index = tuple(p._array if isinstance(p, ndarray) else p for p in parts)
    for p in index:
        if isinstance(p, (numpy.ndarray, list)) and numpy.asarray(p).dtype == numpy.bool_:
            _stand_in.count("device_to_host")
    return index if isinstance(key, tuple) else index[0]


def _is_advanced(index):
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, (numpy.ndarray, list)) for p in parts)


class _Flags:
    def __init__(self, array):
        self.c_contiguous = bool(array.flags.c_contiguous)
        self.f_contiguous = bool(array.flags.f_contiguous)
        self.owndata = bool(array.flags.owndata)

    def __getitem__(self, name):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[name]


def _device_method(name):
    launches = name not in _VIEWS

    def method(self, *args, **kwargs):
        if name in _CUBLAS:
            refuse_cublas_under_capture()
        function = getattr(self._array, name)
        operands = [unwrap_nested(a) for a in args]
        keywords = {k: unwrap_nested(v) for k, v in kwargs.items()}

        def compute():
            return function(*operands, **keywords)
        return wrap(_stand_in.run(compute) if launches else _stand_in.view(compute))
    method.__name__ = name
    return method


def _host_copy_method(name):
    """Methods that hand back host values (cupy runs them through `.get()`): counted as host syncs."""
    def method(self, *args, **kwargs):
        return getattr(self.get(), name)(*args, **kwargs)
    method.__name__ = name
    return method


def _binary(numpy_name, reflected=False):
    numpy_ufunc = getattr(numpy, numpy_name)

    def method(self, other):
        try:
            operand = to_host_operand(other)
        except TypeError:
            # cupy answers NotImplemented to a foreign operand; numpy's side then calls
            # __array_ufunc__ below, which refuses numpy arrays.
            return NotImplemented
        if numpy_name == "matmul":
            refuse_cublas_under_capture()
        if reflected:
            return wrap(_stand_in.run(lambda: numpy_ufunc(operand, self._array)))
        return wrap(_stand_in.run(lambda: numpy_ufunc(self._array, operand)))
    return method


def _inplace(numpy_name):
    numpy_ufunc = getattr(numpy, numpy_name)

    def method(self, other):
        operand = to_host_operand(other)
        _stand_in.run(lambda: numpy_ufunc(self._array, operand, out=self._array))
        return self
    return method


class ndarray:
    """cupy.ndarray over a numpy array; construct through the cupy routines, as with cupy."""

    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("the cupy stand-in has no raw device memory (memptr/strides)")
        self._array = numpy.empty(shape, dtype=dtype, order=order)
        _stand_in.track(self)

    @classmethod
    def _from_host_storage(cls, array):
        self = cls.__new__(cls)
        self._array = array
        return _stand_in.track(self)

    # ---- the wall between host and device
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, numpy_ufunc, method, *inputs, **kwargs):
        # cupy maps numpy ufuncs to its own, whose argument check refuses numpy arrays.
        import cupy
        func = getattr(cupy, numpy_ufunc.__name__, None)
        if not isinstance(func, ufunc):
            return NotImplemented
        if method != "__call__":
            func = getattr(func, method)
        if "out" in kwargs:
            (kwargs["out"],) = kwargs["out"]
        return func(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        import cupy
        cupy_func = getattr(cupy, func.__name__, None)
        if cupy_func is None or cupy_func is func:
            return NotImplemented
        return cupy_func(*args, **kwargs)

    @property
    def __cuda_array_interface__(self):
        """CUDA's array interface (v3) as cupy exports it, with the current stream; the pointer is host memory,
        which a machine without a CUDA driver reads as host memory (what the collectives and mpi4py do)."""
        from cupy import cuda
        stream = cuda.get_current_stream()
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": [("", self.dtype.str)],
                "data": (self._array.__array_interface__["data"][0], False),
                "strides": None if self._array.flags.c_contiguous else self._array.strides, "version": 3,
                "stream": 1 if stream.is_null else stream.ptr}

    def get(self, stream=None, order="C", out=None, blocking=True):
        """The array copied to the host (a device-to-host copy: counted)."""
        _stand_in.count("device_to_host")
        host = numpy.array(self._array, order=order, copy=True)
        if out is None:
            return host
        if not isinstance(out, numpy.ndarray):
            raise TypeError(f"Only numpy.ndarray can be obtained from cupy.ndarray, not {type(out)}")
        if out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError("Shape or dtype mismatch")
        out[...] = host
        return out

    def set(self, arr, stream=None):
        """Copies host array `arr` (same shape and dtype) into this array (a host-to-device copy)."""
        if not isinstance(arr, numpy.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, not {type(arr)}")
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError("Shape mismatch." if arr.shape != self.shape else "dtype mismatch")
        _stand_in.host_to_device(self._array, arr, stream)

    def item(self):
        return self.get().item()

    tolist = _host_copy_method("tolist")
    tobytes = _host_copy_method("tobytes")

    def __int__(self):
        return int(self.get())

    def __float__(self):
        return float(self.get())

    def __complex__(self):
        return complex(self.get())

    def __bool__(self):
        if self.size == 0:
            return False
        if self.size == 1:
            return bool(self.get())
        raise ValueError("The truth value of an array with more than one element is ambiguous. "
                         "Use a.any() or a.all()")

    def __repr__(self):
        return repr(self.get())

    def __str__(self):
        return str(self.get())

    def __format__(self, format_spec):
        return format(self.get(), format_spec)

    def __reduce__(self):
        raise TypeError("the cupy stand-in does not pickle device arrays; copy them to the host with .get()")

    # ---- attributes
    shape = property(lambda self: self._array.shape)
    dtype = property(lambda self: self._array.dtype)
    size = property(lambda self: self._array.size)
    ndim = property(lambda self: self._array.ndim)
    strides = property(lambda self: self._array.strides)
    itemsize = property(lambda self: self._array.itemsize)
    nbytes = property(lambda self: self._array.nbytes)
    flags = property(lambda self: _Flags(self._array))
    T = property(lambda self: wrap(self._array.T))
    real = property(lambda self: wrap(self._array.real))
    imag = property(lambda self: wrap(self._array.imag))

    @property
    def base(self):
        return None if self._array.base is None else wrap(self._array.base)

    @shape.setter
    def shape(self, value):
        self._array.shape = value

    # ---- device-side methods (cupy.ndarray's own list; each stays on the device)
    for _name in ("all", "any", "argmax", "argmin", "astype", "clip", "conj", "copy", "cumprod", "cumsum",
                  "diagonal", "dot", "flatten", "max", "mean", "min", "nonzero", "prod", "ptp", "ravel",
                  "repeat", "reshape", "round", "squeeze", "std", "sum", "swapaxes", "take", "trace",
                  "transpose", "var", "view", "argsort", "sort"):
        locals()[_name] = _device_method(_name)
    del _name

    def fill(self, value):
        if isinstance(value, ndarray):
            if value.shape != ():
                raise ValueError("non-scalar cupy.ndarray cannot be used for fill")
            source = value._array
            _stand_in.run(lambda: self._array.fill(source[()]))
            return
        value = numpy.asarray(value, dtype=self.dtype)
        if value.shape != ():
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        _stand_in.run(lambda: self._array.fill(value[()]))

    # ---- containers and indexing
    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return len(self._array)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self)))

    def __getitem__(self, key):
        index = _index(key)
        if _is_advanced(index):  # a gather kernel; basic indexing makes a view
            return wrap(_stand_in.run(lambda: self._array[index]))
        view = self._array[index]
        if isinstance(view, numpy.generic):  # numpy copies out a scalar where cupy gives a 0-d view of the element
            view = self._array[(index if isinstance(index, tuple) else (index,)) + (Ellipsis,)]
        return wrap(view)

    def __setitem__(self, key, value):
        index = _index(key)
        if isinstance(value, ndarray):
            source = value._array
        elif _is_advanced(index):
            # cupy uploads host values for integer-array and mask indexing (core.array(value))
            if isinstance(value, numpy.ndarray):
                _stand_in.count("host_to_device")
                value = value.copy()
            source = value
        else:
            # for basic indexing cupy stores a host value through fill(), which takes only scalars
            value = numpy.asarray(value, dtype=self.dtype)
            if value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            source = value[()]

        def store():
            self._array[index] = source
        _stand_in.run(store)

    # ---- operators
    __add__, __radd__, __iadd__ = _binary("add"), _binary("add", True), _inplace("add")
    __sub__, __rsub__, __isub__ = _binary("subtract"), _binary("subtract", True), _inplace("subtract")
    __mul__, __rmul__, __imul__ = _binary("multiply"), _binary("multiply", True), _inplace("multiply")
    __truediv__, __rtruediv__, __itruediv__ = (_binary("true_divide"), _binary("true_divide", True),
                                               _inplace("true_divide"))
    __floordiv__, __rfloordiv__, __ifloordiv__ = (_binary("floor_divide"), _binary("floor_divide", True),
                                                  _inplace("floor_divide"))
    __mod__, __rmod__, __imod__ = _binary("remainder"), _binary("remainder", True), _inplace("remainder")
    __pow__, __rpow__, __ipow__ = _binary("power"), _binary("power", True), _inplace("power")
    __matmul__, __rmatmul__ = _binary("matmul"), _binary("matmul", True)
    __and__, __rand__, __iand__ = _binary("bitwise_and"), _binary("bitwise_and", True), _inplace("bitwise_and")
    __or__, __ror__, __ior__ = _binary("bitwise_or"), _binary("bitwise_or", True), _inplace("bitwise_or")
    __xor__, __rxor__, __ixor__ = _binary("bitwise_xor"), _binary("bitwise_xor", True), _inplace("bitwise_xor")
    __lt__, __le__ = _binary("less"), _binary("less_equal")
    __gt__, __ge__ = _binary("greater"), _binary("greater_equal")
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")
    __hash__ = None

    def __neg__(self):
        return wrap(_stand_in.run(lambda: -self._array))

    def __pos__(self):
        return wrap(_stand_in.run(lambda: +self._array))

    def __abs__(self):
        return wrap(_stand_in.run(lambda: abs(self._array)))

    def __invert__(self):
        return wrap(_stand_in.run(lambda: ~self._array))

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()


ndarray.__module__ = "cupy"
