"""convert_imageset: a list of "path label" lines -> LMDB of Datum, like Caffe's convert_imageset.

Each line is an image path relative to ROOT_FOLDER, a space, and an integer label (the label is
after the last space, so paths may contain spaces). Keys are "%08d_<path>" in list order (after
the optional shuffle). Images are stored as raw BGR (or grey) C x H x W bytes, or, with
--encoded, as the image file itself (re-encoded as --encode_type when resized or recoloured).
Needs Pillow to read images.

CLI (Caffe's flags): convert_imageset [--gray] [--shuffle] [--resize_height=H --resize_width=W]
    [--check_size] [--encoded] [--encode_type=png|jpg] [--backend=lmdb] ROOT_FOLDER/ LISTFILE DB_NAME
"""
import argparse
import os
import sys

import numpy

from scaffe.data.datum import array_to_datum, encode_image, load_image, require_pillow
from scaffe.data.lmdb_writer import LMDBWriter
from scaffe.log import get_logger
from scaffe.tools.gflags import run_tool, switches

__all__ = ["main", "read_image_list", "convert_imageset"]

log = get_logger(__name__)


def read_image_list(list_file):
    """[(path, label)] from a list file; a line without a label is an error naming the line."""
    entries = []
    with open(list_file, "r", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            path, sep, label = line.rpartition(" ")
            if not sep or not path:
                raise ValueError(f"{list_file}:{number}: expected 'path label', got {line!r}")
            try:
                entries.append((path, int(label)))
            except ValueError:
                raise ValueError(f"{list_file}:{number}: label {label!r} is not an integer") from None
    return entries


def _format_of(path):
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP"}.get(ext, ext.upper() or "PNG")


def convert_imageset(root_folder, list_file, db_path, gray=False, shuffle=False, resize_height=0,
                     resize_width=0, check_size=False, encoded=False, encode_type="", seed=0):
    """Writes the LMDB; returns the number of images stored. `seed` fixes the shuffle order."""
    require_pillow("convert_imageset")
    entries = read_image_list(list_file)
    if shuffle:
        log.info("Shuffling data")
        order = numpy.random.RandomState(seed).permutation(len(entries))
        entries = [entries[i] for i in order]
    log.info("A total of %d images.", len(entries))
    if (resize_height > 0) != (resize_width > 0):
        raise ValueError("give both --resize_height and --resize_width, or neither")
    color = not gray
    first_shape = None
    stored = 0
    with LMDBWriter(db_path) as db:
        for line_id, (rel_path, label) in enumerate(entries):
            path = os.path.join(root_folder, rel_path)
            try:
                image = load_image(path, color=color, height=resize_height, width=resize_width)
            except (OSError, ValueError) as e:
                # Caffe skips unreadable images with a warning and goes on.
                log.error("Could not open or find file %s: %s", path, e)
                continue
            if check_size:
                first_shape = first_shape or image.shape
                if image.shape != first_shape:
                    raise ValueError(f"{path}: size {image.shape} differs from the first image's {first_shape}")
            if encoded:
                payload = _encoded_image(path, rel_path, image, encode_type, resized=bool(resize_height))
                datum = array_to_datum(None, label, encoded_bytes=payload)
            else:
                datum = array_to_datum(image, label)
            db.put(f"{line_id:08d}_{rel_path}".encode("utf-8"), datum.SerializeToString())
            stored += 1
            if stored % 1000 == 0:
                log.info("Processed %d files.", stored)
    if stored % 1000:
        log.info("Processed %d files.", stored)
    return stored


def _encoded_image(path, rel_path, image, encode_type, resized):
    """The image file's bytes if they already hold `image` in the wanted format, else `image` re-encoded."""
    fmt = encode_type.upper() if encode_type else _format_of(rel_path)
    fmt = "JPEG" if fmt == "JPG" else fmt
    if not resized and _format_of(rel_path) == fmt and _file_channels(path) == image.shape[0]:
        with open(path, "rb") as f:
            return f.read()
    return encode_image(image, fmt)


def _file_channels(path):
    Image = require_pillow()
    with Image.open(path) as img:
        return 1 if img.mode in ("1", "L", "LA", "I", "I;16", "F") else 3


_SWITCHES = ("gray", "shuffle", "check_size", "encoded")


def _parser():
    p = argparse.ArgumentParser(prog="convert_imageset", description="Convert a list of images to an LMDB of Datum.")
    p.add_argument("root_folder")
    p.add_argument("list_file")
    p.add_argument("db_name")
    for name, help_text in zip(_SWITCHES, ("store grey images", "shuffle the list first",
                                           "require all images to have the same size",
                                           "store encoded image files instead of raw pixels")):
        p.add_argument(f"--{name}", action="store_true", help=help_text)
    p.add_argument("--resize_height", "-resize_height", type=int, default=0)
    p.add_argument("--resize_width", "-resize_width", type=int, default=0)
    p.add_argument("--encode_type", "-encode_type", default="", help="png, jpg, ...; implies --encoded")
    p.add_argument("--backend", "-backend", default="lmdb", help="only lmdb is supported")
    p.add_argument("--seed", "-seed", type=int, default=0, help="seed of the --shuffle order")
    return p


def main(argv=None):
    args = _parser().parse_args(switches(sys.argv[1:] if argv is None else argv, _SWITCHES, "convert_imageset"))
    if args.encode_type and not args.encoded:
        log.info("encode_type specified, assuming encoded=true.")
    return run_tool("convert_imageset", args.backend, lambda: convert_imageset(
        args.root_folder, args.list_file, args.db_name, gray=args.gray, shuffle=args.shuffle,
        resize_height=args.resize_height, resize_width=args.resize_width, check_size=args.check_size,
        encoded=args.encoded or bool(args.encode_type), encode_type=args.encode_type, seed=args.seed))


if __name__ == "__main__":
    from scaffe.cli import tool_script  # glog's settings and lines, as for every command
    sys.exit(tool_script("convert_imageset"))
