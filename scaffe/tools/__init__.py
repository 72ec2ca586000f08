"""Caffe's tools in Python: convert_mnist, convert_imageset, compute_image_mean, extract_features and
the upgrade_net_proto_text|binary / upgrade_solver_proto_text tools (upgrade_proto), `scaffe convert`
(convert) over the first two, and from Caffe's tools/extra parse_log (with plot_log for its picture).

Each module has `main(argv) -> exit code` taking Caffe's arguments, for the `scaffe` CLI to call by name
(it imports none of them itself).
"""
