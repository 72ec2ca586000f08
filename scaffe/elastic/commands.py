"""`scaffe commits [--dir D]` and `scaffe commit-to-snapshot PATH --prefix P`: the commits of this host."""
import argparse
import sys

from scaffe.elastic import settings
from scaffe.elastic.state import list_commits, write_snapshot
from scaffe.log import get_logger

log = get_logger(__name__)


def commits(argv):
    """Prints `<iteration> <path>` for every complete commit in the commit directory, newest first."""
    parser = argparse.ArgumentParser(prog="scaffe commits", description=commits.__doc__)
    parser.add_argument("--dir", default="", help="the commit directory (default: SCAFFE_COMMIT_DIR, else "
                                                  f"{settings.COMMITS_ROOT}/$SCAFFE_JOB_ID)")
    args = parser.parse_args(argv)
    for iteration, path in list_commits(args.dir or settings.commit_dir()):
        sys.stdout.write(f"{iteration} {path}\n")
    return 0


def commit_to_snapshot(argv):
    """Writes commit PATH as <prefix>_iter_<N>.caffemodel and .solverstate, which `scaffe train --snapshot`
    resumes."""
    parser = argparse.ArgumentParser(prog="scaffe commit-to-snapshot", description=commit_to_snapshot.__doc__)
    parser.add_argument("path", help="a commit directory (see scaffe commits)")
    parser.add_argument("--prefix", required=True, help="the snapshot prefix, as a solver's snapshot_prefix")
    args = parser.parse_args(argv)
    model_path, state_path = write_snapshot(args.path, args.prefix)
    log.info("Wrote %s and %s from commit %s", model_path, state_path, args.path)
    return 0
