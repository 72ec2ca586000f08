"""Caffe's data tools in Python: convert_mnist, convert_imageset and compute_image_mean.

Each module has `main(argv) -> exit code` taking Caffe's arguments, for the `scaffe` CLI to call.
"""
