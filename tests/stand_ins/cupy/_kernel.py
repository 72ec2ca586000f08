"""cupy.ElementwiseKernel and RawKernel for the stand-in: the CUDA source cannot run here, so each kernel runs a numpy
twin registered under the kernel's name (_twins.py), after the arguments were checked against the
kernel's declared parameters exactly as cupy binds them (count, raw/elementwise, dtype of T, scalars)."""
import numpy

from cupy._core import ndarray


_BLOCK = 1 << 18


def _parse_params(spec):
    """'raw T x, int32 n' -> [(is_raw, type name, name)]."""
    params = []
    for item in spec.split(","):
        words = item.split()
        if not words:
            continue
        is_raw = words[0] == "raw"
        if is_raw:
            words = words[1:]
        if len(words) != 2:
            raise ValueError(f"cannot parse kernel parameter {item.strip()!r}")
        params.append((is_raw, words[0], words[1]))
    return params


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, loop_prep="", after_loop="", options=()):
        self.in_params = _parse_params(in_params)
        self.out_params = _parse_params(out_params)
        self.operation = operation
        self.name = name
        self.preamble = preamble
        self.options = tuple(options)

    def __call__(self, *args, size=None, block_size=None):
        from cupy import _stand_in, _twins
        _stand_in.count(f"launch:{self.name}")
        twin = _twins.TWINS.get(self.name)
        if twin is None:
            raise NotImplementedError(f"cupy stand-in: no numpy twin for ElementwiseKernel {self.name!r}; "
                                      f"register one in tests/stand_ins/cupy/_twins.py")
        params = self.in_params + self.out_params
        if len(args) != len(params):
            raise TypeError(f"Wrong number of arguments for {self.name!r}: expected {len(params)}, "
                            f"got {len(args)}")
        type_of, bound = {}, {}
        for param, value in zip(params, args):
            bound[param[2]] = self._bind(param, value, type_of)
        count = self._loop_size(params, args, size)

        def compute():
            for first in range(0, count, _BLOCK):  # in blocks, so the twins' index arrays stay small
                twin(numpy.arange(first, min(first + _BLOCK, count), dtype=numpy.int64), **bound)
        _stand_in.run(compute)
        outputs = args[len(self.in_params):]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _bind(self, param, value, type_of):
        """What the twin gets for `value` passed as `param`; `type_of` collects the dtypes of the type
        parameters (T) seen so far, which must agree."""
        is_raw, type_name, name = param
        if isinstance(value, ndarray):
            if type_name[0].isupper():
                previous = type_of.setdefault(type_name, value.dtype)
                if previous != value.dtype:
                    raise TypeError(f"{self.name}: type {type_name} is both {previous} and {value.dtype}")
            elif numpy.dtype(type_name) != value.dtype and not is_raw:
                raise TypeError(f"{self.name}: {name} must be {type_name}, got {value.dtype}")
            return value._array
        if is_raw or param in self.out_params:
            raise TypeError(f"{self.name}: {name} must be a cupy.ndarray, not {type(value)}")
        if isinstance(value, numpy.ndarray):
            raise TypeError(f"Unsupported type {type(value)}")
        # a scalar, cast to the declared C type as cupy does
        return numpy.dtype(type_name).type(value) if not type_name[0].isupper() else value

    def _loop_size(self, params, args, size):
        """The number of loop indices: the size of the elementwise arrays (all one shape), else `size`."""
        elementwise = [value._array for (is_raw, _, _), value in zip(params, args)
                       if not is_raw and isinstance(value, ndarray)]
        if elementwise:
            shapes = {a.shape for a in elementwise}
            if len(shapes) != 1:
                raise ValueError(f"{self.name}: elementwise arguments have shapes {sorted(shapes)}; the stand-in "
                                 f"does not broadcast")
            return elementwise[0].size
        if size is not None:
            return int(size)
        raise ValueError(f"{self.name}: loop size is undecided")


class RawKernel:
    """cupy.RawKernel for the stand-in: the kernels registered in kernels.cuda_sources by
    register_elementwise (one per dtype, `<twin name>_<dtype>`) run the numpy twin of their name, bound
    by the parameter names of the CUDA signature; the last parameter, `total`, is the loop count."""

    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=False):
        from kernels.cuda_sources import CudaSource
        self.code, self.name, self.options = code, name, tuple(options)
        self.parameters = CudaSource(name, code, self.options).parameters

    def __call__(self, grid, block, args, *, shared_mem=0):
        from cupy import _stand_in, _twins
        from kernels.cuda_sources import SCALAR_TYPES
        base, _, _ = self.name.rpartition("_")
        twin = _twins.TWINS.get(base)
        if twin is None or self.parameters[-1] != ("long long", "total"):
            raise NotImplementedError(f"cupy stand-in: no numpy twin for RawKernel {self.name!r}")
        _stand_in.count(f"launch:{base}")
        if len(args) != len(self.parameters):
            raise TypeError(f"{self.name}: expected {len(self.parameters)} arguments, got {len(args)}")
        bound = {}
        for (c_type, name), value in zip(self.parameters, args):
            if c_type.endswith("*"):
                if not isinstance(value, ndarray):
                    raise TypeError(f"{self.name}: {name} must be a cupy.ndarray, not {type(value)}")
                bound[name] = value._array
            elif type(value) is not SCALAR_TYPES[c_type]:  # cupy passes a scalar by its own numpy type
                raise TypeError(f"{self.name}: {name} is {c_type}, got {type(value)}")
            else:
                bound[name] = value
        total = int(bound.pop("total"))
        _stand_in.run(lambda: twin(numpy.arange(total, dtype=numpy.int64), **bound))
