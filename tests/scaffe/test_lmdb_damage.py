"""Damaged LMDBs: refused with one line naming the database, never a crash, a hang or a silent subset.

The databases are written here in one transaction, so every page past the two meta pages belongs to the
tree or to a value (no free pages): the MNIST test set bundled with the repository (1,000 records of
795 bytes, 3 branch pages over 250 leaves) and 60 records of 5,000 bytes on overflow pages. Reads that
might crash (SIGBUS, liblmdb's assertions) run in a worker process (workers/read_lmdbs.py).
"""
import json
import logging
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from scaffe import io as sio
from scaffe.blob import Blob
from scaffe.data.lmdb_writer import LMDBWriter
from scaffe.layer_impls import create_layer
from scaffe.proto import caffe_pb2
from scaffe.tools import compute_image_mean, convert_mnist

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("workers") / "read_lmdbs.py"
PAGE = 4096
NO_ROOT = 2 ** 64 - 1
# The subprocesses import this tree's scaffe, whatever else is installed.
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


@pytest.fixture(scope="module")
def mnist_db(tmp_path_factory):
    data_dir = convert_mnist.bundled_mnist_dir()
    path = tmp_path_factory.mktemp("mnist") / "mnist_test_lmdb"
    convert_mnist.convert_mnist(data_dir / "t10k-images-idx3-ubyte.gz", data_dir / "t10k-labels-idx1-ubyte.gz",
                                path)
    return path


@pytest.fixture(scope="module")
def overflow_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("overflow") / "db"
    with LMDBWriter(path, commit_every=100) as db:
        for i in range(60):
            db.put(b"%08d" % i, bytes([i]) * 5000)
    return path


class Layout:
    """Where the tree of an LMDB data file (liblmdb 0.9, 4 KiB pages) keeps its pages and pointers."""

    def __init__(self, data):
        self.meta = PAGE if _u64(data, PAGE + 144) > _u64(data, 144) else 0
        self.root = _u64(data, self.meta + 128)
        self.pages = len(data) // PAGE
        self.children = {}       # branch page -> [(file offset of a child's 6-byte page number, the child)]
        self.leaves = {}         # leaf page -> its number of records
        self.value_pointers = []  # file offsets of the 8-byte page numbers of values on overflow pages
        pending = [self.root]
        while pending:
            page = pending.pop()
            at, flags, count = page * PAGE, _u16(data, page * PAGE + 10), (_u16(data, page * PAGE + 12) - 16) // 2
            nodes = [at + _u16(data, at + 16 + 2 * i) for i in range(count)]
            if flags == 1:
                self.children[page] = [(node, int.from_bytes(data[node:node + 6], "little")) for node in nodes]
                pending.extend(child for _, child in self.children[page])
            else:
                self.leaves[page] = count
                self.value_pointers += [node + 8 + _u16(data, node + 6) for node in nodes if _u16(data, node + 4) & 1]
        assert 2 + len(self.children) + len(self.leaves) + 2 * len(self.value_pointers) == self.pages

    def lower_branch(self):
        """A branch page below the root."""
        return next(page for page in self.children if page != self.root)


def _u16(data, at):
    return struct.unpack_from("<H", data, at)[0]


def _u64(data, at):
    return struct.unpack_from("<Q", data, at)[0]


def _write(data, at, value, width):
    return data[:at] + value.to_bytes(width, "little") + data[at + width:]


def save(data, folder):
    folder.mkdir(parents=True)
    (folder / "data.mdb").write_bytes(data)
    return folder


def data_layer(source):
    param = sio.parse_net_text(f'layer {{ name: "mnist" type: "Data" top: "data" top: "label" '
                               f'data_param {{ source: "{source}" batch_size: 10 backend: LMDB }} }}').layer[0]
    layer = create_layer(param, caffe_pb2.TEST)
    layer.setup([], [Blob(), Blob()])
    return layer


def read_in_worker(pairs, timeout=120):
    """The worker's outcome lines for (original, mutant) pairs; a crash or a hang fails the test."""
    argv = [str(p) for pair in pairs for p in pair]
    try:
        proc = subprocess.run([sys.executable, str(WORKER), *argv], cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the reads hung; last lines: {(e.stdout or b'')[-300:]!r}")
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, f"exit {proc.returncode} reading {lines[-1] if lines else None}: {proc.stderr[-2000:]}"
    return [line for line in lines if "start" not in line]


def test_a_truncated_lmdb_is_one_line_and_exit_1(mnist_db, tmp_path):
    data = (mnist_db / "data.mdb").read_bytes()
    db = save(data[:353933], tmp_path / "cut")
    (tmp_path / "net.prototxt").write_text(f"""
        layer {{ name: "mnist" type: "Data" top: "data" top: "label"
                 data_param {{ source: "{db}" batch_size: 10 backend: LMDB }} }}
        layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param {{ num_output: 10 }} }}
        layer {{ name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }}""")
    (tmp_path / "none.caffemodel").write_bytes(caffe_pb2.NetParameter().SerializeToString())
    problem = f"LMDB {db}: truncated: 353,933 of {len(data):,} bytes; copy it again"
    for argv, line in [(["compute_image_mean", str(db)], f"compute_image_mean: {problem}"),
                       (["test", "-model", "net.prototxt", "-weights", "none.caffemodel", "-iterations", "1"],
                        f"scaffe test: error: net.prototxt: layer 'mnist' (Data): {problem}")]:
        proc = subprocess.run([sys.executable, "-m", "scaffe", *argv], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env=ENV)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.splitlines()[-1] == line and "Traceback" not in proc.stderr


def test_a_damaged_branch_page_is_refused_with_the_count(mnist_db, tmp_path, monkeypatch, capsys, caplog):
    data = (mnist_db / "data.mdb").read_bytes()
    layout = Layout(data)
    branch = layout.lower_branch()
    # One node less in its header: the records under its last child drop out of every scan.
    lost = layout.leaves[layout.children[branch][-1][1]]
    db = save(_write(data, branch * PAGE + 12, _u16(data, branch * PAGE + 12) - 2, 2), tmp_path / "db")
    assert compute_image_mean.main([str(db)]) == 1
    err = capsys.readouterr().err
    assert err == (f"compute_image_mean: LMDB {db}: header says 1,000 records, walk found {1000 - lost:,}; copy it "
                   "again or rebuild it (SCAFFE_LMDB_PARTIAL=1 reads the records found)\n")
    monkeypatch.setenv("SCAFFE_LMDB_PARTIAL", "1")
    caplog.set_level(logging.INFO)
    assert compute_image_mean.main([str(db)]) == 0
    assert f"header says 1,000 records, walk found {1000 - lost:,}; reading the {1000 - lost:,} found" in caplog.text
    assert f"Processed {1000 - lost} files." in caplog.text


def test_a_meta_root_on_a_leaf_is_refused_with_the_count(mnist_db, tmp_path):
    data = (mnist_db / "data.mdb").read_bytes()
    layout = Layout(data)
    leaf = min(layout.leaves)
    db = save(_write(data, layout.meta + 128, leaf, 8), tmp_path / "db")
    with pytest.raises(sio.CaffeFormatError) as refused:
        data_layer(db)
    assert str(refused.value).startswith(f"layer 'mnist' (Data): LMDB {db}: header says 1,000 records, walk found "
                                         f"{layout.leaves[leaf]}; ")


def test_a_page_pointing_at_its_ancestor_is_refused_within_a_second(mnist_db, tmp_path):
    data = (mnist_db / "data.mdb").read_bytes()
    layout = Layout(data)
    pointer, _ = layout.children[layout.lower_branch()][0]
    db = save(_write(data, pointer, layout.root, 6), tmp_path / "db")
    reads = read_in_worker([(mnist_db, db)], timeout=30)
    assert [read["held"] for read in reads] == [False, True]  # py-lmdb's read, then scaffe.data.lmdb_file's
    for read in reads:
        assert read["error"] == (f"LMDB {db}: page {layout.root} is reached twice (a cycle, or a page written over "
                                 "another); the database is damaged; copy it again or rebuild it")
        assert read["seconds"] < 1


def test_lmdb_errors_from_the_tools_and_the_data_layer_are_one_line(mnist_db, tmp_path, capsys):
    data = (mnist_db / "data.mdb").read_bytes()
    layout = Layout(data)
    pointer, _ = layout.children[layout.root][0]  # on the way to the first record
    db = save(_write(data, pointer, 1_000_000, 6), tmp_path / "db")
    problem = f"LMDB {db}: a pointer to page 1,000,000, outside its pages 2..{layout.pages - 1}; the database is damaged"
    assert compute_image_mean.main([str(db)]) == 1
    assert capsys.readouterr().err.startswith(f"compute_image_mean: {problem}")
    with pytest.raises(sio.CaffeFormatError, match=f"^layer 'mnist' \\(Data\\): {problem}"):
        data_layer(db)


def test_a_value_on_a_page_that_is_no_overflow_page_is_refused_as_it_is_read(overflow_db, tmp_path):
    # The walk leaves overflow pages unread; each reader checks the first one's type as it reads the value.
    data = (overflow_db / "data.mdb").read_bytes()
    layout = Layout(data)
    first = _u64(data, layout.value_pointers[7])
    db = save(_write(data, first * PAGE + 10, 0x02, 2), tmp_path / "db")
    py_lmdb, own = read_in_worker([(overflow_db, db)])
    assert py_lmdb["error"] == (f"LMDB {db}: mdb_cursor_get: MDB_CORRUPTED: Located page was wrong type; the database "
                                "is damaged; copy it again or rebuild it")
    assert own["error"] == (f"LMDB {db}: record b'00000007': the first page of its value, {first}, is not an overflow "
                            "page; the database is damaged; copy it again or rebuild it")


# ---------------------------------------------------------------- seeded mutations

def mnist_mutants(data, layout, rng):
    """(kind, mutated data): six mutants of each kind of the MNIST database, chosen by `rng`."""
    tree = range(2, layout.pages)
    pointers = [pointer for children in layout.children.values() for pointer, _ in children]
    roots = [page for page in (NO_ROOT, *tree) if page != layout.root]
    kinds = {
        "truncated": lambda: data[:rng.randrange(len(data))],
        "zeroed": lambda: _write(data, rng.randrange(layout.pages) * PAGE, 0, PAGE),
        "header": lambda: _flip_header_byte(data, rng.randrange(layout.pages), rng),
        "copied": lambda: _copy_page(data, *rng.sample(tree, 2)),
        "child": lambda: _redirect(data, rng.choice(pointers), 6, layout.pages, rng),
        "root": lambda: _write(data, layout.meta + 128, rng.choice(roots), 8),
    }
    return [(kind, make()) for kind, make in kinds.items() for _ in range(6)]


def overflow_mutants(data, layout, rng):
    """(kind, mutated data): four mutants of each kind of the database of values on overflow pages. Those
    values carry no check of their own in LMDB, so their bytes (all but the first page's header) are left alone."""
    tree = [0, 1, *layout.leaves]
    first_overflow = [_u64(data, pointer) for pointer in layout.value_pointers]
    kinds = {
        "value": lambda: _redirect(data, rng.choice(layout.value_pointers), 8, layout.pages, rng),
        "header": lambda: _flip_header_byte(data, rng.choice(tree + first_overflow), rng),
        "zeroed": lambda: _write(data, rng.choice(tree) * PAGE, 0, PAGE),
    }
    return [(kind, make()) for kind, make in kinds.items() for _ in range(4)]


def _flip_header_byte(data, page, rng):
    at = page * PAGE + rng.randrange(16)
    return _write(data, at, data[at] ^ rng.randrange(1, 256), 1)


def _copy_page(data, source, target):
    return data[:target * PAGE] + data[source * PAGE:(source + 1) * PAGE] + data[(target + 1) * PAGE:]


def _redirect(data, pointer, width, pages, rng):
    """`pointer` set to another page, past the last one at times."""
    old = int.from_bytes(data[pointer:pointer + width], "little")
    return _write(data, pointer, rng.choice([page for page in range(pages + 3) if page != old]), width)


def test_seeded_mutations_are_refused_or_read_in_full(mnist_db, overflow_db, tmp_path):
    rng = random.Random(33)
    pairs, kinds = [], {}
    for original, make in ((mnist_db, mnist_mutants), (overflow_db, overflow_mutants)):
        data = (original / "data.mdb").read_bytes()
        for kind, mutated in make(data, Layout(data), rng):
            mutant = save(mutated, tmp_path / f"{len(pairs):02d}_{kind}")
            pairs.append((original, mutant))
            kinds[str(mutant)] = kind
    reads = read_in_worker(pairs)
    assert len(reads) == 2 * len(pairs)
    for read in reads:
        assert "raw" not in read, read
        assert read["seconds"] < 1, read
        if "error" in read:
            assert read["error"].startswith(f"LMDB {read['db']}: ") and "\n" not in read["error"], read
        else:  # only a flipped header byte that no reader looks at leaves the records as they were
            assert read["equal"] and kinds[read["db"]] == "header", read
    for py_lmdb, own in zip(reads[::2], reads[1::2]):  # the same verdict from either reader
        assert ("error" in py_lmdb) == ("error" in own), (py_lmdb, own)
        assert "error" in own or own["reader"] == "LMDBFile", own
    refused = [read for read in reads if "error" in read]
    assert len(refused) > len(reads) * 3 // 4
