"""Pictures of a net (pycaffe's caffe.draw): a NetParameter as a Graphviz graph through pydot, one node per
layer and per blob, drawn by Graphviz's `dot` program into PNG, SVG, PDF ... or kept as dot text.

Building the graph (`get_pydot_graph`) needs only the pydot package; drawing it (`draw_net`,
`draw_net_to_file`) needs `dot` on PATH as well (Debian: apt-get install graphviz).
"""
import shutil

from scaffe.proto import caffe_pb2

try:
    import pydot
except ImportError as error:
    raise ImportError("scaffe.draw needs pydot: pip install pydot (or scaffe[draw])") from error

__all__ = ["LAYER_STYLE_DEFAULT", "NEURON_LAYER_STYLE", "BLOB_STYLE", "get_pooling_types_dict", "get_edge_label",
           "get_layer_lr_mult", "get_layer_label", "choose_color_by_layertype", "get_pydot_graph", "draw_net",
           "draw_net_to_file"]

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}

_LAYER_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
                 "InnerProduct": "#CC33FF"}
_LEARNING_TYPES = ("Convolution", "Deconvolution", "InnerProduct")


def get_pooling_types_dict():
    """Pooling method number -> its name in caffe.proto (0 -> "MAX", ...)."""
    return {value.number: name for name, value in
            caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR.values_by_name.items()}


def get_edge_label(layer):
    """The label of the edges out of `layer`: the batch size of a Data layer, the outputs of a learning layer."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def get_layer_lr_mult(layer):
    """(weights, bias) learning rate multipliers of a Convolution, Deconvolution or InnerProduct layer."""
    if layer.type not in _LEARNING_TYPES:
        raise ValueError(f"{layer.type} layers do not have a learning rate multiplier")
    if len(layer.param) > 2:
        raise ValueError(f"layer {layer.name!r} has {len(layer.param)} param entries; a {layer.type} has 2 blobs")
    multipliers = [param.lr_mult for param in layer.param]
    return tuple(multipliers + [1.0] * (2 - len(multipliers)))


def _window_description(layer):
    if layer.type == "Pooling":
        pooling = layer.pooling_param
        return pooling.kernel_size, pooling.stride, pooling.pad
    conv = layer.convolution_param
    # Caffe's defaults for the repeated fields left empty: kernel 1 (unset), stride 1, pad 0.
    return ((conv.kernel_size or [1])[0], (conv.stride or [1])[0], (conv.pad or [0])[0])


def get_layer_label(layer, rankdir, display_lrm=False):
    """The text of a layer's node: name, type (with the pooling method), window sizes of a convolution or
    pooling, and the learning rate multipliers if `display_lrm`. Lines run across the graph's flow
    (newlines for rankdir "LR"/"RL", spaces for "TB"/"BT")."""
    separator = " " if rankdir in ("TB", "BT") else r"\n"
    kind = layer.type
    if kind == "Pooling":
        kind = f"{kind} {get_pooling_types_dict()[layer.pooling_param.pool]}"
    lines = [layer.name, f"({kind})"]
    if layer.type in ("Convolution", "Deconvolution", "Pooling"):
        kernel, stride, pad = _window_description(layer)
        lines.append(separator.join([f"kernel size: {kernel}", f"stride: {stride}", f"pad: {pad}"]))
    if display_lrm and layer.type in _LEARNING_TYPES:
        weights_mult, bias_mult = get_layer_lr_mult(layer)
        if weights_mult or bias_mult:
            lines.append(f"lr mult: {weights_mult:.1f}, {bias_mult:.1f}")
    # Quoted, or dot reads the colons as port names.
    return '"' + separator.join(lines) + '"'


def choose_color_by_layertype(layertype):
    """A layer node's fill colour: red convolutions, orange pooling, purple inner products, blue the rest."""
    return _LAYER_COLORS.get(layertype, LAYER_STYLE_DEFAULT["fillcolor"])


def _in_phase(layer, phase):
    """Whether the layer's include/exclude rules keep it in `phase` (None: every layer is drawn)."""
    if phase is None:
        return True
    if layer.include and layer.exclude:
        raise ValueError(f"layer {layer.name} has both include and exclude specified.")
    if layer.include:
        return any(not rule.HasField("phase") or rule.phase == phase for rule in layer.include)
    return not any(rule.HasField("phase") and rule.phase == phase for rule in layer.exclude)


def _layer_style(layer):
    if len(layer.bottom) == 1 and list(layer.top) == list(layer.bottom):
        return NEURON_LAYER_STYLE  # an in-place layer (ReLU, Dropout ...)
    return dict(LAYER_STYLE_DEFAULT, fillcolor=choose_color_by_layertype(layer.type))


def _quoted(name):
    return '"' + name.replace('"', r'\"') + '"'


def get_pydot_graph(caffe_net, rankdir, label_edges=True, phase=None, display_lrm=False):
    """The pydot.Dot graph of NetParameter `caffe_net`: blob -> layer -> blob, in layout direction `rankdir`
    ("LR", "TB", "BT", "RL"), only the layers of `phase` (caffe_pb2.TRAIN/TEST) when it is given."""
    graph = pydot.Dot(_quoted(caffe_net.name or "Net"), graph_type="digraph", rankdir=rankdir)
    # One node per name: layers that share name and type (a TRAIN and a TEST Data layer) share a node.
    nodes = {}
    edges = []
    for layer in caffe_net.layer:
        if not _in_phase(layer, phase):
            continue
        layer_node = _quoted(f"{layer.name}_{layer.type}")
        nodes[layer_node] = pydot.Node(layer_node, label=get_layer_label(layer, rankdir, display_lrm),
                                       **_layer_style(layer))
        for blob in list(layer.bottom) + list(layer.top):
            nodes[_quoted(f"{blob}_blob")] = pydot.Node(_quoted(f"{blob}_blob"), label=_quoted(blob), **BLOB_STYLE)
        top_label = get_edge_label(layer) if label_edges else '""'
        edges += [(_quoted(f"{bottom}_blob"), layer_node, '""') for bottom in layer.bottom]
        edges += [(layer_node, _quoted(f"{top}_blob"), top_label) for top in layer.top]
    for node in nodes.values():
        graph.add_node(node)
    for source, destination, label in edges:
        graph.add_edge(pydot.Edge(source, destination, label=label))
    return graph


def draw_net(caffe_net, rankdir, ext="png", phase=None, display_lrm=False):
    """The net drawn by Graphviz in format `ext` ("png", "svg", "pdf", ...) as bytes; "raw" gives the dot
    text itself (no Graphviz needed)."""
    graph = get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm)
    if ext == "raw":
        return graph.to_string().encode()
    if shutil.which("dot") is None:
        raise RuntimeError("draw_net: Graphviz's dot program is not on PATH (Debian: apt-get install graphviz); "
                           "get_pydot_graph() and the 'raw' format work without it")
    return graph.create(prog="dot", format=ext)


def draw_net_to_file(caffe_net, filename, rankdir="LR", phase=None, display_lrm=False):
    """Draws the net into `filename` in the format its extension names; ".raw" writes the dot text that
    Graphviz would draw."""
    ext = str(filename).rpartition(".")[2]
    with open(filename, "wb") as out:
        out.write(draw_net(caffe_net, rankdir, ext, phase, display_lrm))
