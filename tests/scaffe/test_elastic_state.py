"""Commits of the training state (scaffe.elastic): replicated to another (simulated) host, resumed at 2, 1 and
3 ranks on the uninterrupted run's trajectory, turned into a snapshot, and GROW stopping every rank together.

One 2-rank LeNet run (batch 6 per rank: a global batch of 12, which 1, 2 and 3 ranks can all make up) commits
every 2 of 6 iterations; the resumed runs start from its commit at iteration 4 and commit at 6, so their
commits at 6 are compared with its own."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from scaffe import io as sio
from scaffe.cli import main
from scaffe.elastic.growth import EXIT_GROW

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
SOLVER = """net: "net.prototxt"
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 0
max_iter: 6
snapshot_after_train: false
snapshot_prefix: "snap"
random_seed: 7
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A folder with the small LeNet job and the uninterrupted 2-rank run's commits, rank 0's in a0 and the
    copy rank 1 received, as another host (SCAFFE_RANKS_PER_NODE=1), in a1."""
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))
    folder = tmp_path_factory.mktemp("elastic")
    net = (ROOT / "examples" / "mnist" / "lenet_train_test.prototxt").read_text()
    net = net.replace("examples/mnist/", f"{ROOT}/examples/mnist/").replace("batch_size: 64", "batch_size: 6")
    (folder / "net.prototxt").write_text(net)
    (folder / "solver.prototxt").write_text(SOLVER)
    done = _mpiexec(folder, ["a0", "a1"], [])
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def _mpiexec(folder, dirs, args, env=None):
    """`scaffe train` on one rank per commit directory of `dirs` (each rank its own SCAFFE_COMMIT_DIR); every
    rank a node of its own, so that commits travel to another."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "SCAFFE_RANKS_PER_NODE": "1", "SCAFFE_COMMIT_ITERS": "2", **(env or {})}
    cmd = [str(MPIEXEC)]
    for k, directory in enumerate(dirs):
        cmd += ([":"] if k else []) + ["-n", "1", "-env", "SCAFFE_COMMIT_DIR", directory, sys.executable, "-m",
                                       "scaffe", "train", "--solver=solver.prototxt", *args]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=180,
                          start_new_session=True)


def _weights(commit):
    return sio.read_weights(os.path.join(commit, "model.caffemodel"))


def _bytes(commit, name):
    return (Path(commit) / name).read_bytes()


def test_commits_are_listed_newest_first_and_replicated(job, capsys):
    assert main(["commits", "--dir", str(job / "a0")]) == 0
    assert capsys.readouterr().out == f"6 {job}/a0/iter_000000006\n4 {job}/a0/iter_000000004\n"  # 2 kept
    for name in ("model.caffemodel", "state.solverstate", "ranks.json", "commit.json"):
        assert _bytes(job / "a1/iter_000000006", name) == _bytes(job / "a0/iter_000000006", name), name
    meta = json.loads(_bytes(job / "a0/iter_000000004", "commit.json"))
    assert (meta["iter"], meta["ranks"], meta["global_batch"], meta["solver"]) == (4, 2, 12, str(job / "solver.prototxt"))
    state = sio.read_solverstate(job / "a0/iter_000000004/state.solverstate")
    assert state.iter == 4 and len(state.history) == 8  # the S-Caffe schedule's root alone holds the history
    assert main(["commits", "--dir", str(job / "none")]) == 0 and capsys.readouterr().out == ""


def test_resumed_at_two_ranks_bit_for_bit_and_grow_stops_every_rank(job):
    """From the replica of iteration 4, at the same rank count: the arithmetic is the same, so the commit at 6
    is the uninterrupted run's byte for byte. GROW, in rank 0's directory only, stops both ranks after it."""
    (job / "b0").mkdir()
    (job / "b0" / "GROW").touch()
    done = _mpiexec(job, ["b0", "b1"], [f"--resume-commit={job}/a1/iter_000000004"])
    assert done.returncode == EXIT_GROW, done.stderr[-3000:]
    stops = re.findall(r"Rank (\d): GROW found at iteration (\d+)", done.stderr)
    assert sorted(stops) == [("0", "6"), ("1", "6")]
    for name in ("model.caffemodel", "state.solverstate"):
        assert _bytes(job / "b0/iter_000000006", name) == _bytes(job / "a0/iter_000000006", name), name


def test_resumed_at_one_and_three_ranks_keeps_the_global_batch(job, monkeypatch):
    """At 1 rank (iter_size 2) and at 3 ranks (batch 4) each iteration reads the same 12 samples: the weights at
    6 equal the uninterrupted run's up to the order of summation of the gradients (float32: 1e-5 relative)."""
    monkeypatch.chdir(job)
    monkeypatch.setenv("SCAFFE_COMMIT_ITERS", "2")
    monkeypatch.setenv("SCAFFE_COMMIT_DIR", str(job / "c"))
    assert main(["train", "--solver=solver.prototxt", f"--resume-commit={job}/a0/iter_000000004"]) == 0
    three = _mpiexec(job, ["d", "d", "d"], [f"--resume-commit={job}/a0/iter_000000004", "--schedule=native"],
                     env={"SCAFFE_RANKS_PER_NODE": ""})
    assert three.returncode == 0, three.stderr[-3000:]
    assert "global batch 12 = 4 per rank x 3 ranks x iter_size 1 (committed: 6 per rank x 2 ranks x iter_size 1)" \
        in three.stderr
    expected, start = _weights(job / "a0/iter_000000006"), _weights(job / "a0/iter_000000004")
    for resumed in (_weights(job / "c/iter_000000006"), _weights(job / "d/iter_000000006")):
        assert resumed.keys() == expected.keys()
        for layer, blobs in expected.items():
            for got, want, before in zip(resumed[layer], blobs, start[layer]):
                numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=layer)
                assert not numpy.array_equal(got, before), f"{layer} did not train"


def test_a_global_batch_the_ranks_cannot_make_up_is_refused(job, monkeypatch):
    from scaffe.elastic.resume import batch_plan, resume_from_commit
    from scaffe.solvers import SolverError, solver_from_file
    assert [batch_plan(12, ranks, 6) for ranks in (1, 2, 3, 4, 5)] == [(6, 2), (6, 1), (4, 1), (3, 1), None]
    assert batch_plan(128, 1, 64) == (64, 2) and batch_plan(128, 4, 64) == (32, 1)
    monkeypatch.chdir(job)
    solver = solver_from_file("solver.prototxt")
    with pytest.raises(SolverError, match="cannot resume on 5 ranks: the commit's global batch 12 is not 5 x a whole"):
        resume_from_commit(solver, job / "a0/iter_000000004", 0, 5)
    solver.close()


def test_a_commit_becomes_a_snapshot_that_train_resumes(job, monkeypatch):
    monkeypatch.chdir(job)
    monkeypatch.setenv("SCAFFE_COMMIT_ITERS", "2")
    monkeypatch.setenv("SCAFFE_COMMIT_DIR", str(job / "e"))
    assert main(["commit-to-snapshot", str(job / "a0/iter_000000004"), "--prefix", str(job / "s")]) == 0
    assert (job / "s_iter_4.caffemodel").read_bytes() == _bytes(job / "a0/iter_000000004", "model.caffemodel")
    state = sio.read_solverstate(job / "s_iter_4.solverstate")
    assert (state.iter, state.learned_net) == (4, str(job / "s_iter_4.caffemodel"))
    assert main(["train", "--solver=solver.prototxt", f"--snapshot={job}/s_iter_4.solverstate"]) == 0
    assert [os.path.basename(p) for p in sorted(os.listdir(job / "e"))] == ["iter_000000006"]


WIDE_NET = """name: "wide"
layer { name: "data" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 2 dim: 5 } shape { dim: 2 } data_filler { type: "gaussian" }
  data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "z" top: "z" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "loss" }
"""


def _small_solver(solver_type="Adam"):
    from google.protobuf import text_format

    from scaffe.proto import caffe_pb2
    from scaffe.solvers import create_solver
    param = caffe_pb2.SolverParameter(type=solver_type, base_lr=0.01, lr_policy="fixed", max_iter=3)
    text_format.Merge(WIDE_NET, param.net_param)
    solver = create_solver(param)
    solver.step(2)
    return solver


def test_a_commits_files_parse_as_the_caffemodel_and_solverstate_protobuf_writes():
    """The chunks written without protobuf's copies parse into the messages protobuf itself builds."""
    from scaffe.elastic.state import Capture, HostCopies, ModelLayout
    from scaffe.proto import caffe_pb2
    from scaffe.solvers.sgd import solver_state
    solver = _small_solver()
    pool = HostCopies(solver)
    capture = Capture(solver, [{}], 2, pool.take(timeout=0), pool)
    files = {name: b"".join(bytes(chunk) for chunk in chunks)
             for name, chunks in capture.files(ModelLayout(solver.net)).items()}
    written = caffe_pb2.NetParameter.FromString(files["model.caffemodel"])
    expected = caffe_pb2.NetParameter(name="wide")
    for record in solver.net.layer_records:
        layer = expected.layer.add()
        layer.CopyFrom(record.layer.param)
        sio.set_layer_blobs(layer, [solver.net.learnable_params[solver.net.param_records[p].learnable_id].data
                                    for p in record.param_ids])
    assert written == expected and len(written.layer[1].blobs) == 2
    state = caffe_pb2.SolverState.FromString(files["state.solverstate"])
    assert state == solver_state(2, "model.caffemodel", solver.current_step, solver.history)
    assert len(state.history) == 4  # Adam: two sets


def test_host_copies_are_reused_and_at_most_two_exist():
    from scaffe.elastic.state import HostCopies
    pool = HostCopies(_small_solver("SGD"))
    first, second = pool.take(timeout=0), pool.take(timeout=0)
    assert first is not second and pool.take(timeout=0.01) is None
    pool.give_back(first)
    assert pool.take(timeout=0) is first


def test_the_measured_spacing_keeps_a_commits_background_work_under_its_share(tmp_path):
    """SCAFFE_COMMIT_ITERS=auto: 0.5 s to store and send a commit, against iterations of 0.1 s, needs 100 of them
    between commits for 5%; work that takes less keeps the floor."""
    from scaffe.elastic.committer import Committer
    solver = _small_solver("SGD")
    committer = Committer(solver, 2, str(tmp_path), measured=True)
    committer._last_commit = {"iteration": 10, "seconds": 1.0}
    committer.replication.busy_s = 0.5
    assert committer._measured_spacing({"iteration": 20, "seconds": 2.0}) == 100
    committer.replication.busy_s = 0.001
    assert committer._measured_spacing({"iteration": 20, "seconds": 2.0}) == 2
    committer.measured = False
    committer.replication.busy_s = 0.5
    assert committer._measured_spacing({"iteration": 20, "seconds": 2.0}) == 2
    committer.close()


def test_the_replica_makes_the_parameters_file_itself_and_refuses_one_that_differs(tmp_path):
    """The root sends the replica the files it lacks and the checksums of those it makes from its own copies:
    equal copies give the root's bytes; a parameter that differs (diverged ranks) is an error, not a commit."""
    from scaffe.elastic.replication import ReplicaMismatch, Replication
    from scaffe.elastic.state import Capture, HostCopies, ModelLayout, checksum
    solver = _small_solver("SGD")
    layout = ModelLayout(solver.net)
    pool, own_pool = HostCopies(solver), HostCopies(solver, history=False)
    root = Capture(solver, [{}], 2, pool.take(timeout=0), pool).files(layout)
    replica = Replication(str(tmp_path / "replica"), layout)
    sent = {name: [b"".join(bytes(chunk) for chunk in root[name])]
            for name in ("state.solverstate", "ranks.json", "commit.json")}
    sums = {"model.caffemodel": checksum(root["model.caffemodel"])}
    mine = Capture(solver, [], 0, own_pool.take(timeout=0), own_pool)
    replica._complete("iter_000000002", dict(sent), sums, mine)
    stored = tmp_path / "replica" / "iter_000000002"
    assert (stored / "model.caffemodel").read_bytes() == b"".join(bytes(chunk) for chunk in root["model.caffemodel"])
    mine.learnables[0].flat[0] += 1
    with pytest.raises(ReplicaMismatch, match="commit iter_000000003: rank 0's own model.caffemodel differs from the "
                                              "root's: the ranks' parameters have diverged"):
        replica._complete("iter_000000003", dict(sent), sums, mine)
    replica.close()


def test_under_the_allreduce_schedule_the_replica_makes_its_commit_from_its_own_state(job):
    """Every rank holds the parameters and the history there: only ranks.json and commit.json travel, and the
    replica's files equal the root's byte for byte (a difference would have ended the job)."""
    done = _mpiexec(job, ["c0", "c1"], ["--schedule=allreduce"])
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("model.caffemodel", "state.solverstate", "ranks.json", "commit.json"):
        assert _bytes(job / "c1/iter_000000006", name) == _bytes(job / "c0/iter_000000006", name), name
    assert len(sio.read_solverstate(job / "c1/iter_000000006/state.solverstate").history) == 8
