"""The compiled step loop behind `compiled.run`, numba's twin of `interpreted.run` (protocol.py describes
the steps), and the reduce of a block for each dtype: factories that `kernels.native` compiles once per host
and loads without numba.

Everything here addresses shared memory and the caller's arrays by integer address, as MPI hands them out.
"""
import numpy
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels._views import matrix, view

# kernels.native keys the compiled code by this file (and kernels/_views.py) alone: a constant or function
# imported from another module would stay frozen in the cached code after that module changed. So the
# control block's slots and the wait policy (protocol.py's, wait.py's) arrive at run time, in `description`,
# whose record type and the block size are the factory's arguments; everything compiled in is defined here.


@intrinsic
def load_acquire(typingctx, address):
    def codegen(context, builder, sig, args):
        pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(pointer, "acquire", 8)
    return types.int64(types.int64), codegen


@intrinsic
def store_release(typingctx, address, value):
    def codegen(context, builder, sig, args):
        pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        builder.store_atomic(args[1], pointer, "release", 8)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen


def _call_libc(builder, name, args):
    # By symbol name, resolved when the code is loaded: the cached machine code holds no address.
    fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)] * len(args))
    builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


@intrinsic
def sched_yield(typingctx):
    def codegen(context, builder, sig, args):
        _call_libc(builder, "sched_yield", [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def usleep(typingctx, microseconds):
    def codegen(context, builder, sig, args):
        _call_libc(builder, "usleep", [builder.trunc(args[0], ir.IntType(32))])
        return context.get_dummy_value()
    return types.void(types.int64), codegen


@njit(nogil=True)
def field_address(flags, row, rank, field):
    return flags + (row * rank + field) * 8


@njit(nogil=True)
def reached(flags, row, ranks, field, value):
    for k in ranks:
        if load_acquire(field_address(flags, row, k, field)) < value:
            return False
    return True


@njit(nogil=True)
def publish(flags, row, me, field, value):
    store_release(field_address(flags, row, me, field), value)


@njit(nogil=True)
def wait(idle, d):
    """One more failed check (the idle-th in a row): spin, then yield the core, then nap, each nap twice the
    last up to the longest (wait.py)."""
    naps = idle - d.spins - d.yields
    if naps > 0:
        usleep(min(d.nap_us << min(naps - 1, 20), d.longest_nap_us))
    elif idle > d.spins:
        sched_yield()


@intrinsic
def move(typingctx, destination, source, count):
    """count bytes from address source to address destination (regions that do not overlap)."""
    def codegen(context, builder, sig, args):
        byte_pointer = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(args[0], byte_pointer), builder.inttoptr(args[1], byte_pointer),
                           args[2], 1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@njit(nogil=True)
def copy(out, data):
    # An explicit loop: numba's slice assignment into a carray was seen to lose its stores.
    for i in range(out.shape[0]):
        out[i] = data[i]


@njit(inline="always")
def binop(x, y, op):
    # op: its position in collectives.ops.COMPILED_OPS. Inlined into each loop below, where LLVM hoists
    # the test of `op` out and vectorises what is left.
    if op == 0:
        return x + y
    if op == 1:
        return x * y
    if op == 2:
        return numpy.minimum(x, y)
    return numpy.maximum(x, y)


@njit(nogil=True)
def combine(out, also, a, b, op, both):
    """out[i] = op(a[i], b[i]), and also[i] too when `both`: one pass however many outputs."""
    if both:
        for i in range(out.shape[0]):
            value = binop(a[i], b[i], op)
            out[i] = value
            also[i] = value
    else:
        for i in range(out.shape[0]):
            out[i] = binop(a[i], b[i], op)


_WORDS = numpy.empty(0, numpy.int64)  # the type of the int64 arrays run reads by address
# reduce(out, also, both, sources, size, count, op, acc), all int64: the arguments of `reducer`'s functions,
# which `run` calls by address (call_reduce), so that the loop is compiled once for every dtype.
REDUCE = (types.int64,) * 8


@intrinsic
def call_reduce(typingctx, address, out, also, both, sources, size, count, op, acc):
    """The reduce at `address` (a `reducer` function's native entry) on the rest."""
    def codegen(context, builder, sig, args):
        pointer = ir.IntType(8).as_pointer()
        signature = ir.FunctionType(ir.IntType(32), [pointer, pointer] + [ir.IntType(64)] * 8)
        # numba's calling convention: a slot for the result and one for an exception, neither written here
        slots = [builder.bitcast(cgutils.alloca_once(builder, ir.IntType(64), size=8), pointer) for _ in range(2)]
        builder.call(builder.inttoptr(args[0], signature.as_pointer()), slots + list(args[1:]))
        return context.get_dummy_value()
    return types.void(*[types.int64] * 9), codegen


def reducer(dtype):
    """The reduce of a block of `dtype` elements, by addresses: out (and also, when both) = the `count`
    elements at each of the `size` addresses at `sources`, combined by op in that order; two inputs in one
    pass, more through acc (a block that stays in L1) with the outputs written by the last."""
    like = numpy.empty(0, dtype)

    def reduce_block(out, also, both, sources, size, count, op, acc):
        inputs = view(sources, _WORDS, size)
        result, second = view(out, like, count), view(also, like, count)
        if size == 1:
            copy(result, view(inputs[0], like, count))
            if both != 0:
                copy(second, result)
            return
        first = view(inputs[0], like, count)
        if size > 2:
            part = view(acc, like, count)
            combine(part, part, first, view(inputs[1], like, count), op, False)
            for k in range(2, size - 1):
                combine(part, part, part, view(inputs[k], like, count), op, False)
            first = part
        combine(result, second, first, view(inputs[size - 1], like, count), op, both != 0)
    return reduce_block, REDUCE


RUN = (types.int64,) * 17


def loop(description_type, block):  # noqa: C901 (the body is run's)
    """`run` for SharedWindows.description records of `description_type`, reducing `block` elements at a time
    (the accumulator stays in L1); its arguments are int64 (RUN)."""
    like_description = numpy.empty(0, description_type)

    def run(description, input_ring_addresses, result_ring_addresses, alloc_base_addresses, windows,  # noqa: C901
            starts_address, scratch, source, destination, item, target, per_cell, base, op, hands_out, ready, reduce):
        """`interpreted.run`'s steps for the ops numba computes: copy in, reduce and drain group after group.

        description: the address of a SharedWindows.description; input_ring_addresses, result_ring_addresses:
        of each local rank's rings of cells; alloc_base_addresses: of the [windows, local size] addresses of
        each alloc window's segments here; starts_address: of every rank's first element, then n
        (protocol.starts); scratch: of 6 * local size int64 and block * 16 bytes this call may write. source,
        destination: the addresses of the send buffer's n elements of `item` bytes and of the receive buffer's
        (0 on a Reduce's other ranks); target: the Reduce's local target, or -1 when every rank reads the result;
        base: seq << 32; op: a code of binop; hands_out, ready: protocol.MODES; reduce: the address of
        `reducer`'s function for the elements' dtype. Everything here but `reduce` moves bytes, so this loop is
        compiled once for every dtype.
        """
        d = matrix(description, like_description, 1, 1)[0, 0]
        flags, row, me, size, stride, depth = (d.control, d.slots_per_rank, d.local_rank, d.local_size,
                                               d.cell_stride, d.depth)
        input_rings, result_rings = view(input_ring_addresses, _WORDS, size), view(result_ring_addresses, _WORDS, size)
        alloc_bases = matrix(alloc_base_addresses, _WORDS, windows, size)
        starts = view(starts_address, _WORDS, size + 1)
        words = view(scratch, _WORDS, 6 * size)
        peers, others = words[:size - 1], words[size:2 * size]
        send_shift, result_shift = words[2 * size:3 * size], words[3 * size:4 * size]
        in_place, sources = words[4 * size:5 * size], words[5 * size:]
        acc_at, sources_at = scratch + 6 * size * 8, scratch + 5 * size * 8
        longest = 0
        for j in range(size):
            longest = max(longest, starts[j + 1] - starts[j])
        groups = -(-longest // per_cell)
        for k in range(size - 1):
            peers[k] = k if k < me else k + 1
        reader = target < 0 or target == me
        readers = 0  # owners write only their own destination unless they hand results out
        for k in range(size):
            if hands_out and k != me and (target < 0 or k == target):
                others[readers] = k
                readers += 1
        other_readers = others[:readers]
        to_cell = other_readers.shape[0] > 0  # my results go through a cell; else only into my destination
        # Peers publish their buffers' line offsets and alloc windows with COPIED = base.
        idle = 0
        while not reached(flags, row, peers, d.copied, base):
            idle += 1
            wait(idle, d)
        for k in range(size):
            in_place[k] = -1  # else the address of a send buffer read where it is
            send_shift[k] = load_acquire(field_address(flags, row, k, d.send_line_off))
            result_shift[k] = load_acquire(field_address(flags, row, k if target < 0 else target, d.recv_line_off))
            win = load_acquire(field_address(flags, row, k, d.send_win))
            if win >= 0 and not ready:
                in_place[k] = alloc_bases[win, k] + load_acquire(field_address(flags, row, k, d.send_off))
        copied = groups if ready or in_place[me] >= 0 else 0
        if in_place[me] >= 0:
            publish(flags, row, me, d.copied, base | copied)
        reduced = 0
        drained = 0 if reader and hands_out else groups
        idle = 0
        while copied < groups or reduced < groups or drained < groups:
            can_copy = copied < groups and (copied < depth or reached(flags, row, peers, d.reduced,
                                                                      base | (copied - depth + 1)))
            if can_copy and copied <= reduced:  # peers' reduces wait on my copies: feed them first
                step = 1
            elif drained < groups and reached(flags, row, peers, d.reduced, base | (drained + 1)):
                step = 3
            elif reduced < groups and (ready or reached(flags, row, peers, d.copied, base | (reduced + 1))) and (
                    reduced < depth or reached(flags, row, other_readers, d.drained, base | (reduced - depth + 1))):
                step = 2
            elif can_copy:
                step = 1
            else:
                idle += 1
                wait(idle, d)
                continue
            idle = 0
            if step == 1:  # my pieces of the group's chunks, into my input cells
                slot = copied % depth
                for j in range(size):
                    lo = starts[j] + copied * per_cell
                    hi = min(starts[j + 1], lo + per_cell)
                    if j != me and lo < hi:
                        move(input_rings[me] + (slot * size + j) * stride + send_shift[me], source + lo * item,
                             (hi - lo) * item)
                copied += 1
                publish(flags, row, me, d.copied, base | copied)
            elif step == 2:  # my piece of the group from every rank's input, into my result cell and destination
                slot = reduced % depth
                lo = starts[me] + reduced * per_cell
                hi = min(starts[me + 1], lo + per_cell)
                cells = result_rings[me] + slot * stride + result_shift[me]
                if ready:  # my range of the destination is final already: only hand it out
                    if to_cell and lo < hi:
                        move(cells, destination + lo * item, (hi - lo) * item)
                else:
                    for start in range(lo, hi, block):
                        stop = min(hi, start + block)
                        for k in range(size):  # in local-rank order: the result does not depend on timing
                            if k == me:
                                sources[k] = source + start * item
                            elif in_place[k] >= 0:
                                sources[k] = in_place[k] + start * item
                            else:
                                sources[k] = (input_rings[k] + (slot * size + me) * stride + send_shift[k]
                                              + (start - lo) * item)
                        cell = cells + (start - lo) * item
                        out = destination + start * item if reader else cell
                        call_reduce(reduce, out, cell if to_cell else out, 1 if reader and to_cell else 0, sources_at,
                                    size, stop - start, op, acc_at)
                reduced += 1
                publish(flags, row, me, d.reduced, base | reduced)
            else:  # the other owners' results of the group, into my destination
                slot = drained % depth
                for j in range(size):
                    lo = starts[j] + drained * per_cell
                    hi = min(starts[j + 1], lo + per_cell)
                    if j != me and lo < hi:
                        move(destination + lo * item, result_rings[j] + slot * stride + result_shift[j],
                             (hi - lo) * item)
                drained += 1
                publish(flags, row, me, d.drained, base | drained)
        if in_place[me] >= 0:  # peers read my send buffer in place: it is mine again once they are done
            while not reached(flags, row, peers, d.reduced, base | groups):
                idle += 1
                wait(idle, d)
    return run, RUN
