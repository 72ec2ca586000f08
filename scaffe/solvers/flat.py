"""A net's learnable blobs in flat buffers: data, diff and the solver's history, one array each.

Each blob's data and diff become views of their slice (in the net's learnable order, so a layer's blobs
are one contiguous span, and so are consecutive layers'), which lets a distributed schedule send one
message per layer, or one for several small layers, instead of one per blob, and a GPU solver update
every blob in one elementwise kernel per step (scaffe.solvers.fused; the CPU, one pass per blob). For
the GPU kernel each learnable blob's lr_mult and decay_mult are spread over its elements, once, when it
first asks.
"""
import functools

import numpy


class FlatParams:
    def __init__(self, net, history_sets):
        xp = net.xp
        blobs = net.learnable_params
        self.dtype = blobs[0].dtype
        counts = [blob.count for blob in blobs]
        self.bounds = numpy.concatenate([[0], numpy.cumsum(counts)]).astype(int).tolist()
        total = self.bounds[-1]
        self.data = xp.empty(total, self.dtype)
        self.diff = xp.zeros(total, self.dtype)
        for blob, start, stop in zip(blobs, self.bounds, self.bounds[1:]):
            self.data[start:stop] = blob.data.reshape(-1)
            blob.place(self.data[start:stop], self.diff[start:stop])
        net._share_weights()  # blobs shared by name view their owner's new slices
        self.history = [xp.zeros(total, self.dtype) for _ in range(history_sets)]
        self.shapes = [blob.shape for blob in blobs]
        self.lr_multipliers, self.decay_multipliers = list(net.params_lr), list(net.params_weight_decay)
        self._xp, self._counts = xp, counts

    @functools.cached_property
    def lr_mult(self):
        """Each element's blob's lr_mult (one upload; multipliers of shared blobs were settled by the net)."""
        return self._per_element(self.lr_multipliers)

    @functools.cached_property
    def decay_mult(self):
        return self._per_element(self.decay_multipliers)

    def _per_element(self, multipliers):
        return self._xp.asarray(numpy.repeat(numpy.asarray(multipliers, self.dtype), self._counts))

    @staticmethod
    def fits(net):
        """Whether `net` has learnable blobs, all float32 or all float64 (the update kernels')."""
        dtypes = {blob.dtype for blob in net.learnable_params}
        return len(dtypes) == 1 and dtypes <= {numpy.dtype("float32"), numpy.dtype("float64")}

    def history_views(self):
        """The history as the solverstate lists it: every blob's slice of set 0, then of set 1, ..."""
        return [h[start:stop].reshape(shape) for h in self.history
                for start, stop, shape in zip(self.bounds, self.bounds[1:], self.shapes)]

    def span(self, param_ids):
        """(start, stop) of learnable blobs `param_ids`, which must be consecutive."""
        first, last = min(param_ids), max(param_ids)
        if last - first + 1 != len(set(param_ids)):
            raise ValueError(f"learnable blobs {sorted(param_ids)} are not consecutive in the flat buffer")
        return self.bounds[first], self.bounds[last + 1]

    def elements(self, segments):
        """(start, stop) in the flat buffers of `segments`, (param_id, start, stop) element ranges of learnable
        blobs, which must follow each other there (a schedule's piece of a layer)."""
        spans = [(self.bounds[param_id] + start, self.bounds[param_id] + stop) for param_id, start, stop in segments]
        if any(end != start for (_, end), (start, _) in zip(spans, spans[1:])):
            raise ValueError(f"element ranges {list(segments)} do not follow each other in the flat buffer")
        return spans[0][0], spans[-1][1]
