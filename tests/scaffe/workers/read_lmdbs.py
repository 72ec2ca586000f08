"""Reads damaged copies of an LMDB through scaffe's reader and prints what happened, one JSON line a read.

argv: original_db mutant_db [original_db mutant_db ...] (pairs: a mutant and the database it was made from)

Each mutant is read in full twice through scaffe.data.lmdb_reader.LMDBDatabase: first through py-lmdb,
then through scaffe.data.lmdb_file, py-lmdb being made to refuse it by an Environment this process holds
open on it (as a pycaffe script's would). A line {"start": db, "held": ...} comes before each read, so a
crash names the read it killed; then {"db", "held", "seconds"} with "error" (the CaffeFormatError's
message), "raw" (any other exception) or "reader" and "equal" (every record equal to the original's).
"""
import json
import sys
import time

import lmdb

from scaffe.data.lmdb_reader import LMDBDatabase
from scaffe.io import CaffeFormatError


def read(path):
    with LMDBDatabase(path) as db:
        return type(db.env).__name__, list(db.items())


def outcome(path, original):
    start = time.perf_counter()
    try:
        reader, records = read(path)
        result = {"reader": reader, "equal": records == original}
    except CaffeFormatError as e:
        result = {"error": str(e)}
    except Exception as e:  # what the test is there to catch
        result = {"raw": f"{type(e).__name__}: {e}"}
    result["seconds"] = time.perf_counter() - start
    return result


def held_open(path):
    """py-lmdb's Environment on `path`, or None where py-lmdb refuses the file (scaffe must refuse it too)."""
    try:
        return lmdb.open(path, readonly=True, lock=False)
    except lmdb.Error:
        return None


def main(*pairs):
    originals = {}
    for original_path, path in zip(pairs[::2], pairs[1::2]):
        if original_path not in originals:
            originals[original_path] = read(original_path)[1]
        original = originals[original_path]
        for held in (False, True):
            print(json.dumps({"start": path, "held": held}), flush=True)
            holder = held_open(path) if held else None
            try:
                print(json.dumps({"db": path, "held": held, **outcome(path, original)}), flush=True)
            finally:
                if holder is not None:
                    holder.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
