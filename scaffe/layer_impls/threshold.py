"""Threshold layer (Caffe's "Threshold"): 1 where x > threshold, else 0; it has no gradient."""
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class ThresholdLayer(NeuronLayer):
    type = "Threshold"
    needs_input = False

    def setup(self, bottom, top):
        self.threshold = float(self.param.threshold_param.threshold)

    def compute(self, x, y):
        y[...] = x > x.dtype.type(self.threshold)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise NotImplementedError(f"layer {self.name!r}: Threshold has no gradient (as in Caffe)")
