"""Memory by address, for the code kernels.native compiles: arrays that view what a caller passed as an int64
address and a count. Imported only where numba compiles (its source is part of every compiled entry's key)."""
from numba import carray, njit, types
from numba.extending import intrinsic


@intrinsic
def typed_pointer(typingctx, address, like):
    pointer_type = types.CPointer(like.dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer_type))
    return pointer_type(types.int64, like), codegen


@njit(nogil=True)
def view(address, like, count):
    """The `count` elements of like's dtype at `address`, as a 1-D array (a view: nothing owns it)."""
    return carray(typed_pointer(address, like), count)


@njit(nogil=True)
def matrix(address, like, rows, columns):
    return carray(typed_pointer(address, like), (rows, columns))
