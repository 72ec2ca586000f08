"""The training timeline: the trace `scaffe train --timeline` writes, its hidden-communication figure
and per-layer report, and that it reads no clock per layer when off."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy
import pytest
from google.protobuf import text_format

from scaffe import timeline
from scaffe.net import Net
from scaffe.proto import caffe_pb2

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
LENET_TRAIN = ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss"]


@pytest.fixture(scope="module")
def mnist():
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))


def _solver(tmp_path):
    """LeNet on the bundled MNIST with no tests, displays or snapshots: only training iterations."""
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "{ROOT}/examples/mnist/lenet_train_test.prototxt"\n'
                    'base_lr: 0.01 momentum: 0.9 lr_policy: "fixed" display: 0 max_iter: 3\n'
                    'snapshot_after_train: false random_seed: 1 solver_mode: CPU\n')
    return path


def _train(tmp_path, ranks, *flags, timeout=300, env=None):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1", **(env or {}))
    command = ([str(MPIEXEC), "-n", str(ranks)] if ranks > 1 else []) + [
        sys.executable, "-m", "scaffe", "train", f"--solver={_solver(tmp_path)}", *flags]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def _complete(trace, pid=0):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]


def _track_names(trace, pid=0):
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}


def test_one_process_trace_has_every_layer_update_and_data_wait(mnist, tmp_path, capsys):
    log = _train(tmp_path, 1, f"--timeline={tmp_path / 't.json'}")
    assert f"Timeline written to {tmp_path / 't.json'}; no communication recorded" in log
    trace = json.loads((tmp_path / "t.json").read_text())
    events = _complete(trace)
    names = _track_names(trace)
    assert names[timeline.COMPUTE_TRACK] == "compute" and names[timeline.DATA] == "data"
    assert [e["name"] for e in events if e["cat"] == "iteration"] == ["iteration 0", "iteration 1", "iteration 2"]
    forward = [e["name"] for e in events if e["cat"] == "forward"]
    backward = [e["name"] for e in events if e["cat"] == "backward"]
    assert forward == LENET_TRAIN * 3
    assert backward == LENET_TRAIN[:0:-1] * 3  # the data layer has no backward
    assert sum(e["cat"] == "update" for e in events) == 3
    waits = [e for e in events if e["cat"] == "wait"]
    assert [(e["tid"], e["name"]) for e in waits] == [(timeline.DATA, "wait data (scaffe-data-mnist)")] * 3
    # The compute track is one thread's work: its slices follow each other without overlapping.
    compute = sorted((e for e in events if e["tid"] == timeline.COMPUTE_TRACK), key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(compute, compute[1:]))
    # Each iteration holds its forward, backward and update, and each data wait its layer's forward.
    for it in (e for e in events if e["cat"] == "iteration"):
        inside = [e for e in compute if it["ts"] <= e["ts"] and e["ts"] + e["dur"] <= it["ts"] + it["dur"] + 1e-3]
        assert len(inside) == 2 * len(LENET_TRAIN) - 1 + 1
    assert timeline.main([str(tmp_path / "t.json")]) == 0
    breakdown = capsys.readouterr().out.splitlines()[2:4]
    assert breakdown[0].startswith("# rank  iterations  iteration ms") and breakdown[1].split()[:2] == ["0", "3"]
    for wait in waits:
        assert any(f["name"] == "mnist" and f["ts"] <= wait["ts"] and wait["ts"] + wait["dur"] <= f["ts"] + f["dur"] + 1e-3
                   for f in events if f["cat"] == "forward")


def test_native_schedule_collectives_are_labelled_and_not_hidden(mnist, tmp_path):
    """The baseline allreduces every gradient after backward: nothing overlaps, each blob is named."""
    log = _train(tmp_path, 2, "--schedule=native", f"--timeline={tmp_path / 't.json'}")
    assert "0.0% hidden behind compute (rank 0 0.0%, rank 1 0.0%)" in log
    trace = timeline.load(tmp_path / "t.json")
    for rank in (0, 1):
        events = _complete(trace, rank)
        collectives = [e for e in events if e["cat"] == "collective"]
        gradients = [(e["name"], e["args"]["bytes"]) for e in collectives if e["args"].get("carries") == "gradients"]
        # LeNet's weights and biases, in the order backward completes them, every iteration.
        one = [("Allreduce ip2", 20000), ("Allreduce ip2", 40), ("Allreduce ip1", 1600000), ("Allreduce ip1", 2000),
               ("Allreduce conv2", 100000), ("Allreduce conv2", 200), ("Allreduce conv1", 2000),
               ("Allreduce conv1", 80)]
        assert gradients == one * 3
        params = [e["name"] for e in collectives if e["args"].get("carries") == "parameters"]
        assert params == ["Bcast conv1", "Bcast conv2", "Bcast ip1", "Bcast ip2"]  # a layer's blobs: one slice
        assert sum(e["name"] == "wait gradients" for e in events) == 3
    rows = timeline.gradient_overlap(trace)
    assert len(rows) == 2 * 8 and all(r["count"] == 3 and r["hidden_us"] == 0 for r in rows)
    assert all(not r["backward_us"] for r in rows)


def test_commits_and_sharded_tests_talk_in_collectives_the_stall_inspector_hears(mnist, tmp_path):
    """A commit's gather and allreduce and a sharded test's gathers reach collectives.events like the gradients'
    calls: a rank lost while the others wait in one of them (a link gone down at a commit point) is found by the
    stall inspector instead of hanging the job; the timeline hears the same events."""
    solver = tmp_path / "tested.prototxt"
    solver.write_text(f'net: "{ROOT}/examples/mnist/lenet_train_test.prototxt"\n'
                      'base_lr: 0.01 momentum: 0.9 lr_policy: "fixed" display: 0 max_iter: 4 test_iter: 2\n'
                      'test_interval: 2 test_initialization: false snapshot_after_train: false random_seed: 1\n')
    _train(tmp_path, 2, f"--solver={solver}", "--schedule=native", f"--timeline={tmp_path / 't.json'}",
           env={"SCAFFE_COMMIT_ITERS": "2", "SCAFFE_COMMIT_DIR": str(tmp_path / "commits")})
    trace = timeline.load(tmp_path / "t.json")
    for rank in (0, 1):
        names = [e["name"] for e in _complete(trace, rank) if e["cat"] == "collective"]
        # Commits at iterations 2 and 4; tests at 2 and 4 (the last one after training), a gather per round.
        assert [names.count(name) for name in ("Commit gather", "Commit Allreduce", "Test gather")] == [2, 2, 2]


def test_hidden_fraction_and_report_on_a_known_trace():
    def x(name, cat, tid, start, end, **args):
        return {"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid, "ts": start, "dur": end - start,
                "args": args}
    compute, lane, data = timeline.COMPUTE_TRACK, timeline.COLLECTIVES, timeline.DATA
    trace = {"traceEvents": [
        x("iteration 0", "iteration", timeline.ITERATIONS, 0, 50),
        x("data", "forward", compute, 0, 10, layer=0), x("wait data", "wait", data, 1, 2, waits_for="data"),
        x("fc2", "backward", compute, 20, 30, layer=2), x("fc1", "backward", compute, 30, 40, layer=1),
        x("update", "update", compute, 40, 45), x("wait gradients", "wait", compute, 45, 50, waits_for="gradients"),
        x("Bcast fc1", "collective", lane, 0.5, 1.5, bytes=4, carries="parameters", layers=["fc1"]),
        x("Bcast fc2", "collective", lane, 5, 8, bytes=4, carries="parameters", layers=["fc2"]),
        x("Ireduce fc2", "collective", lane, 30, 48, bytes=8, carries="gradients", layers=["fc2"])]}
    summary = timeline.summarize(trace)
    # Hidden: 0.5 of the first Bcast (the rest is the data wait), all 3 of the second, and of the
    # reduce the 10 of fc1's backward plus the 5 of the update, not the wait.
    assert summary["communication_us"] == 22 and summary["hidden_us"] == 18.5
    assert summary["ranks"][0]["compute_us"] == 9 + 20 + 5
    assert timeline.describe(summary) == ("communication 0.0 ms over all ranks, 84.1% hidden behind compute "
                                          "(rank 0 84.1%)")
    # The iteration's 50: 34 of compute, 1 + 5 of waits, and the 10 between forward and backward.
    assert timeline.iteration_breakdown(trace) == [
        {"rank": 0, "iterations": 1, "iteration_ms": 0.05, "compute_ms": 0.034,
         "wait_ms": {"data": 0.001, "parameters": 0.0, "gradients": 0.005}, "other_ms": 0.01}]
    [row] = timeline.gradient_overlap(trace)
    assert row["collective"] == "Ireduce fc2" and row["count"] == 1
    assert row["flight_us"] == 18 and row["hidden_us"] == 15 and row["backward_us"] == {"fc1": 10}
    assert timeline.report(trace)[-1].split() == ["0", "1", "0.018", "83.3%", "8", "Ireduce", "fc2:", "fc1", "0.010"]


NET = """
layer { name: "in" type: "Input" top: "x" top: "y" input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "fc" type: "InnerProduct" bottom: "x" top: "z"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "z" bottom: "y" top: "loss" }
"""


def test_layers_read_no_clock_unless_a_timeline_listens(monkeypatch):
    net = Net(text_format.Parse(NET, caffe_pb2.NetParameter()), "TRAIN")
    net.input_blobs[0].data[...] = numpy.arange(12).reshape(4, 3)
    calls = []
    clock = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: calls.append(1) or clock())
    net.forward_backward()
    assert calls == []
    timed = []
    net.add_hooks(on_layer_timed=lambda *args: timed.append(args))
    net.forward_backward()
    assert [(layer, phase) for layer, phase, _, _ in timed] == [(0, "forward"), (1, "forward"), (2, "forward"),
                                                                (2, "backward"), (1, "backward")]
    assert all(start <= end for _, _, start, end in timed) and len(calls) == 2 * len(timed)



# LeNet's blobs in pieces of 60000 bytes (scaffe.parallel.pieces): weights, then bias, of each layer.
# A layer's blobs are one span of the flat buffers, cut from its end: [1/N] holds its last elements.
PIECES = {"ip2": 1, "ip1": 27, "conv2": 2, "conv1": 1}


def _pieces(op, layers):
    return [f"{op} {layer}" + (f" [{k}/{PIECES[layer]}]" if PIECES[layer] > 1 else "")
            for layer in layers for k in range(1, PIECES[layer] + 1)]


# With SCAFFE_BACKWARD_BYTES=100000 the pieces that fit in 100000 bytes, in backward order, are reduced during
# backward (a piece that does not fit is held, a later smaller one may still fit); the held ones start after
# backward, lowest layer first.
DURING_BACKWARD = ["ip2", "ip1 [1/27]", "conv1"]
HELD = ["conv2 [1/2]", "conv2 [2/2]"] + [f"ip1 [{k}/27]" for k in range(2, 28)]


def test_scaffe_schedule_reduces_each_piece_while_lower_layers_run_backward(mnist, tmp_path):
    """Every gradient Ireduce is named by its layer and piece and starts after that layer's backward, so the
    backward it overlaps can only be of layers below it; some do overlap one; parameters come by Ibcast,
    layer by layer for the first forward, then piece by piece as the root updates them. Pieces beyond the
    backward's budget go after backward, lowest layer first, and the root updates and sends them during the
    next iteration's forward."""
    log = _train(tmp_path, 2, "--schedule=scaffe", f"--timeline={tmp_path / 't.json'}",
                 env={"SCAFFE_PIECE_BYTES": "60000", "SCAFFE_BACKWARD_BYTES": "100000", "SCAFFE_MESSAGE_BYTES": "1"})
    assert re.search(r"Timeline written to .*; communication [\d.]+ ms over all ranks, [\d.]+% hidden behind "
                     r"compute \(rank 0 [\d.]+%, rank 1 [\d.]+%\)", log)
    trace = timeline.load(tmp_path / "t.json")
    index = {name: i for i, name in enumerate(LENET_TRAIN)}
    assert sorted(f"Ireduce {p}" for p in DURING_BACKWARD + HELD) == sorted(_pieces("Ireduce", PIECES))
    for rank in (0, 1):
        events = _complete(trace, rank)
        collectives = [e for e in events if e["cat"] == "collective"]
        reduces = [e for e in collectives if e["args"].get("carries") == "gradients"]
        assert [e["name"] for e in reduces] == [f"Ireduce {p}" for p in DURING_BACKWARD + HELD] * 3
        assert all(e["args"]["bytes"] <= 60000 for e in reduces)
        # The first forward's parameters in forward order, a layer's blobs whole, then each iteration's new
        # ones piece by piece as the root's update of each piece arrives, in backward order.
        assert [e["name"] for e in collectives if e["args"].get("carries") == "parameters"] == [
            f"Ibcast {layer}" for layer in ("conv1", "conv2", "ip1", "ip2")] + [
            f"Ibcast {p}" for p in DURING_BACKWARD + HELD] * 3
        # What else went is the ranks' stop/snapshot flags: a few bytes each iteration.
        assert all(e["args"]["bytes"] < 64 for e in collectives if "carries" not in e["args"])
        for lane in {e["tid"] for e in collectives}:  # a lane's slices follow each other, as Perfetto needs
            slices = sorted((e for e in collectives if e["tid"] == lane), key=lambda e: e["ts"])
            assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(slices, slices[1:]))
        backward = [e for e in events if e["cat"] == "backward"]
        for reduce in reduces:
            [layer] = reduce["args"]["layers"]
            own = [b for b in backward if b["name"] == layer and b["ts"] <= reduce["ts"]]
            assert own and own[-1]["ts"] + own[-1]["dur"] <= reduce["ts"] + 1e-3
        assert {e["name"] for e in events if e["cat"] == "wait" and "parameters" in e["name"]} <= {
            f"wait parameters ({layer})" for layer in ("conv1", "conv2", "ip1", "ip2")} | {"wait parameters"}
    # The root updates the held pieces in the next iteration's forward, before ip1's (their last layer), and
    # starts their Ibcasts there; the last iteration's at the end of training.
    events = _complete(trace, 0)
    iterations = [e for e in events if e.get("cat") == "iteration"]
    updates = [e["ts"] for e in events if e["cat"] == "update"]
    ip1 = [e["ts"] for e in events if e["cat"] == "forward" and e["name"] == "ip1"]
    for k in (1, 2):
        assert sum(iterations[k]["ts"] <= t <= ip1[k] for t in updates) == len(HELD)
    assert sum(t >= iterations[2]["ts"] + iterations[2]["dur"] for t in updates) == len(HELD)
    rows = timeline.gradient_overlap(trace)
    for row in rows:
        layer = row["collective"].split()[1]
        assert row["count"] == 3 and all(index[other] < index[layer] for other in row["backward_us"])
    # The point of the schedule: on every rank some gradients were in flight during a lower layer's backward.
    for rank in (0, 1):
        assert any(row["backward_us"] for row in rows if row["rank"] == rank), timeline.report(trace)


def test_allreduce_schedule_ends_an_iteration_on_its_flags_and_lands_the_rest_in_the_next_forward(mnist, tmp_path):
    """With a budget, the buckets of the pieces that fit go during backward, the held ones after it, lowest layer
    first, behind the ranks' flags on a lane of their own; whatever is still in flight when backward ends is
    updated before the forward that needs it (or at the end of training), which the waits name."""
    _train(tmp_path, 2, "--schedule=allreduce", f"--timeline={tmp_path / 't.json'}",
           env={"SCAFFE_PIECE_BYTES": "60000", "SCAFFE_BACKWARD_BYTES": "100000", "SCAFFE_MESSAGE_BYTES": "1"})
    trace = timeline.load(tmp_path / "t.json")
    for rank in (0, 1):
        events = _complete(trace, rank)
        collectives = [e for e in events if e["cat"] == "collective"]
        buckets = [e["name"] for e in collectives if e["args"].get("carries") == "gradients"]
        # A bucket names its layers, not its pieces: one piece each here.
        assert sorted(buckets) == sorted([f"Iallreduce {p.split(' [')[0]}" for p in DURING_BACKWARD + HELD] * 3)
        flags = [e for e in collectives if "carries" not in e["args"]]
        assert len(flags) == 3 and all(e["args"]["bytes"] < 64 for e in flags)
        waits = {e["name"] for e in events if e["cat"] == "wait" and "parameters" in e["name"]}
        assert waits <= {f"wait parameters ({layer})" for layer in ("conv1", "conv2", "ip1", "ip2")}, waits


def test_gpu_layers_are_timed_by_events_without_waiting_for_the_device(cupy_stand_in, monkeypatch):
    """On a GPU each layer's slice comes from CUDA events recorded around it (Net.stamp), read when the trace
    is written: timing makes no host synchronisation per layer, and the slices still follow each other."""
    from mpi4py import MPI
    monkeypatch.setenv("SCAFFE_CAPTURE", "0")  # eager iterations, timed or not (a timeline turns capture off)

    from perf.bench_train import make_solver
    solver, _ = make_solver("lenet", cupy_stand_in)
    solver.step(1)
    cupy_stand_in._stand_in.reset()
    solver.step(2)
    untimed = cupy_stand_in._stand_in.host_syncs()
    recorder = timeline.Timeline(solver, MPI.COMM_WORLD)
    recorder.start()
    cupy_stand_in._stand_in.reset()
    solver.step(2)
    timed = cupy_stand_in._stand_in.host_syncs()
    recorder.stop()
    assert timed == untimed
    events = recorder.trace_events()
    layers = [e for e in events if e.get("cat") in ("forward", "backward")]
    names = [layer.name for layer in solver.net.layers]
    assert [e["name"] for e in layers if e["cat"] == "forward"] == names * 2
    assert [e["name"] for e in layers if e["cat"] == "backward"] == names[:0:-1] * 2
    assert all(e["dur"] >= 0 for e in layers)
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(layers, layers[1:]))
    iterations = [e for e in events if e.get("cat") == "iteration"]
    assert all(any(it["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= it["ts"] + it["dur"] + 1e-3
                   for it in iterations) for e in layers)
