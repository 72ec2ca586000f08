"""Input layer: tops whose contents the caller writes (deploy nets, `net.blobs['data'].data[...] = x`)."""
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class InputLayer(Layer):
    """Shapes its tops from input_param.shape: none (the caller shapes them), one for all, or one each."""

    type = "Input"
    exact_num_bottom = 0
    min_num_top = 1

    def setup(self, bottom, top):
        shapes = self.param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise ValueError(f"layer {self.name!r} (Input): input_param gives {len(shapes)} shapes "
                             f"for {len(top)} tops; give 0, 1 or {len(top)}")
        for i, blob in enumerate(top):
            if len(shapes):
                shape = shapes[0] if len(shapes) == 1 else shapes[i]
                blob.reshape(tuple(int(d) for d in shape.dim))

    def reshape(self, bottom, top):
        # The tops keep whatever shape setup or the caller gave them, as in Caffe.
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass
