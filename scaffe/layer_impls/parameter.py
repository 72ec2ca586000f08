"""Parameter layer (Caffe's "Parameter"): exposes one learnable blob as its top.

The top *is* the parameter (same data and gradient arrays), so whatever a consumer writes into the
top's gradient is the parameter's gradient, as in Caffe. The blob starts at zero.
"""
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import new_blob
from scaffe.layer_impls.layer import Layer


@register
class ParameterLayer(Layer):
    type = "Parameter"
    exact_num_bottom = 0
    exact_num_top = 1

    def setup(self, bottom, top):
        shape = tuple(int(d) for d in self.param.parameter_param.shape.dim)
        self.blobs = [new_blob(shape, top[0])]

    def reshape(self, bottom, top):
        # Re-shared on every reshape: the blob may have been replaced (weights loaded) since the last one.
        top[0].reshape(self.blobs[0].shape)
        top[0].share_data(self.blobs[0])
        top[0].share_diff(self.blobs[0])

    def forward(self, bottom, top):
        pass
