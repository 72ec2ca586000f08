"""`scaffe convert mnist|imageset ARGS`: the data tools under one command, and with no ARGS for mnist the
bundled digits into examples/mnist."""
import os
import sys

from scaffe.log import get_logger
from scaffe.tools import convert_imageset, convert_mnist

log = get_logger("scaffe.cli")  # the command's lines, as the CLI's own


def main(argv):
    kind, argv = (argv[0], argv[1:]) if argv else ("", [])
    if kind == "mnist":
        if not argv:
            train, test = convert_mnist.ensure_mnist_lmdb(os.path.join("examples", "mnist"))
            log.info("MNIST LMDBs ready: %s, %s", train, test)
            return 0
        return convert_mnist.main(argv)
    if kind == "imageset":
        return convert_imageset.main(argv)
    if kind in ("-h", "--help"):
        sys.stdout.write("usage: scaffe convert mnist [IMAGES LABELS DB] | imageset [flags] ROOT/ LIST DB\n"
                         "  (scaffe convert mnist --help, scaffe convert imageset --help: their flags)\n")
        return 0
    raise SystemExit(f"scaffe convert: say what to convert: mnist [IMAGES LABELS DB] or imageset ROOT/ LIST DB, "
                     f"got {kind!r}")
