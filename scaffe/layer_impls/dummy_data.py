"""DummyData layer: tops of fixed shapes filled by fillers (constant ones once, random ones every pass)."""
from scaffe.data.layer_support import layer_rng
from scaffe.fillers import fill
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2


@register
class DummyDataLayer(Layer):
    type = "DummyData"
    exact_num_bottom = 0
    min_num_top = 1

    def setup(self, bottom, top):
        p = self.param.dummy_data_param
        where = f"layer {self.name!r} (DummyData)"
        n = len(top)
        if len(p.data_filler) not in (0, 1, n):
            raise ValueError(f"{where}: give 0, 1 or {n} data_filler entries, not {len(p.data_filler)}")
        legacy = [p.num, p.channels, p.height, p.width]
        if any(len(v) for v in legacy):
            if len(p.shape):
                raise ValueError(f"{where}: give either shape or num/channels/height/width, not both")
            for name, values in zip(("num", "channels", "height", "width"), legacy):
                if len(values) not in (1, n):
                    raise ValueError(f"{where}: {name} must be given once or {n} times, not {len(values)}")
            shapes = [tuple(int(v[0] if len(v) == 1 else v[i]) for v in legacy) for i in range(n)]
        else:
            if len(p.shape) not in (1, n):
                raise ValueError(f"{where}: give 1 or {n} shape entries, not {len(p.shape)}")
            shapes = [tuple(int(d) for d in (p.shape[0] if len(p.shape) == 1 else p.shape[i]).dim)
                      for i in range(n)]
        if len(p.data_filler):
            self.fillers = [p.data_filler[0 if len(p.data_filler) == 1 else i] for i in range(n)]
        else:
            self.fillers = [caffe_pb2.FillerParameter(type="constant", value=0)] * n
        # Constant tops never change, so they are filled once here; random ones every forward.
        self.refill = [f.type != "constant" for f in self.fillers]
        self.fill_rng = layer_rng(self)
        for blob, shape, filler, refill in zip(top, shapes, self.fillers, self.refill):
            blob.reshape(shape)
            if not refill:
                fill(blob, filler, self.fill_rng)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        for blob, filler, refill in zip(top, self.fillers, self.refill):
            if refill:
                fill(blob, filler, self.fill_rng)

    def backward(self, top, propagate_down, bottom):
        pass
