"""Layer: the fixed life cycle every Caffe layer goes through (setup, reshape, forward, backward)."""


class Layer:
    """Base class. Subclasses set `type` (Caffe's type string) and override the steps they need.

    `param` is the layer's `caffe_pb2.LayerParameter`; `phase` is `caffe_pb2.TRAIN` or `caffe_pb2.TEST`.
    `blobs` holds the learnable parameters as `Blob`s, in Caffe's order (weights, then bias, ...), so
    `.caffemodel` files map onto them one to one.
    """

    type = None

    def __init__(self, param, phase):
        self.param = param
        self.phase = phase
        self.blobs = []

    @property
    def name(self):
        return self.param.name

    def setup(self, bottom, top):
        """Caffe's LayerSetUp: read parameters, create and fill `self.blobs`. Called once."""

    def reshape(self, bottom, top):
        """Shape the tops (and internal buffers) from the bottoms. Called before every forward."""
        raise NotImplementedError(f"layer {self.name!r} of type {self.type} has no reshape")

    def forward(self, bottom, top):
        raise NotImplementedError(f"layer {self.name!r} of type {self.type} has no forward")

    def backward(self, top, propagate_down, bottom):
        """Fill bottom[i].diff where propagate_down[i]; accumulate into each param blob's diff."""

    # Why this layer's GPU forward and backward cannot be replayed from a CUDA graph (scaffe.capture), or
    # None where they can: device work only, on buffers and with kernel arguments that stay the same from
    # one iteration to the next, no host reads, accumulators kept in place. A layer says None once checked:
    # tests/scaffe/test_capture.py replays its gradient cases on new inputs against eager passes.
    capture_refusal_reason = "not checked for CUDA graph capture"

    def capture_refusal(self):
        """`capture_refusal_reason`, for layers whose answer does not depend on how they were set up."""
        return self.capture_refusal_reason

    def random_state(self):
        """The device arrays that hold the state of the layer's random generators: the capture's self-check
        puts them back after its eager half, so that its replayed half draws the same numbers."""
        return []

    # Caffe's ExactNumBottomBlobs / MinTopBlobs ...; None means unchecked.
    exact_num_bottom = None
    min_num_bottom = None
    max_num_bottom = None
    exact_num_top = None
    min_num_top = None
    max_num_top = None

    def allow_force_backward(self, bottom_index):
        return True

    def is_loss(self):
        """Loss layers get loss_weight 1 on their first top by default (Caffe's AutoTopBlobs/loss)."""
        return False
