"""Automatic Split layers (Caffe's util/insert_splits.cpp): a top read by several consumers
is copied once per consumer, so each backward pass writes its own gradient and Split sums them."""
from scaffe.net_filter import NetError
from scaffe.proto import caffe_pb2

__all__ = ["insert_splits", "split_layer_name", "split_blob_name"]


def split_layer_name(layer_name, blob_name, top_index):
    return f"{blob_name}_{layer_name}_{top_index}_split"


def split_blob_name(layer_name, blob_name, top_index, split_index):
    return f"{blob_name}_{layer_name}_{top_index}_split_{split_index}"


def insert_splits(param, source="<net>"):
    """Caffe's InsertSplits: a copy of `param` where every top read by more than one consumer
    (a bottom, or an explicit non-zero loss_weight) goes through a Split layer placed right after
    its producer, each consumer reading its own copy in file order."""
    source_top, consumers, top_loss_weight = _consumers(param, source)
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    next_split = {}  # (layer, top index) -> index of the split copy its next consumer reads
    for i, layer in enumerate(param.layer):
        new_layer = out.layer.add()
        new_layer.CopyFrom(layer)
        for j in range(len(new_layer.bottom)):
            top = source_top[(i, j)]
            if consumers.get(top, 0) > 1:
                k = next_split.get(top, 0)
                next_split[top] = k + 1
                new_layer.bottom[j] = split_blob_name(param.layer[top[0]].name, new_layer.bottom[j], top[1], k)
        for j, blob_name in enumerate(layer.top):
            count = consumers.get((i, j), 0)
            if count <= 1:
                continue
            weight = top_loss_weight.get((i, j), 0.0)
            _add_split(out, layer.name, blob_name, j, count, weight)
            if weight:
                # The loss moves to the split's first copy; the producer no longer carries it.
                new_layer.ClearField("loss_weight")
                next_split[(i, j)] = next_split.get((i, j), 0) + 1
    return out


def _consumers(param, source):
    """Who reads each top: (layer, bottom index) -> its producing (layer, top index), the number of
    consumers of each (layer, top index), and the loss weight given to a top."""
    last_top = {}            # blob name -> (layer index, top index) of its latest producer
    source_top = {}
    consumers = {}
    top_loss_weight = {}
    for i, layer in enumerate(param.layer):
        for j, blob_name in enumerate(layer.bottom):
            if blob_name not in last_top:
                raise NetError(f"{source}: layer '{layer.name}': unknown bottom blob '{blob_name}' "
                               f"(bottom index {j}); no earlier layer produces it")
            top = last_top[blob_name]
            source_top[(i, j)] = top
            consumers[top] = consumers.get(top, 0) + 1
        for j, blob_name in enumerate(layer.top):
            last_top[blob_name] = (i, j)
        # Being used as a loss counts as one more consumer of that top.
        for j in range(min(len(layer.loss_weight), len(layer.top))):
            top = last_top[layer.top[j]]
            top_loss_weight[top] = layer.loss_weight[j]
            if layer.loss_weight[j]:
                consumers[top] = consumers.get(top, 0) + 1
    return source_top, consumers, top_loss_weight


def _add_split(out, layer_name, blob_name, top_index, count, weight):
    """Appends the Split layer giving `count` copies of top `top_index` of layer `layer_name`."""
    split = out.layer.add()
    split.name = split_layer_name(layer_name, blob_name, top_index)
    split.type = "Split"
    split.bottom.append(blob_name)
    for k in range(count):
        split.top.append(split_blob_name(layer_name, blob_name, top_index, k))
        if weight:
            split.loss_weight.append(weight if k == 0 else 0.0)
