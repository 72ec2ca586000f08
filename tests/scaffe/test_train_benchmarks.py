"""perf.train_scaling prints its table for 1 and 2 ranks; perf.plot_timeline draws a trace."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaffe import timeline

ROOT = Path(__file__).resolve().parents[2]


def _perf(module, *args, timeout=300):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", f"perf.{module}", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, start_new_session=True)


def test_train_scaling_table_for_one_and_two_ranks(tmp_path):
    done = _perf("train_scaling", "--ranks", "1,2", "--iterations", "2", "--warmup", "1", "--repeats", "1",
                 "--traces", str(tmp_path), "--link-rate", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# scaffe training scaling: lenet, batch 64 per rank, 2 iterations")
    assert lines[2] == "# link: 100 MB/s one way (--link-rate); wire ms: the gradients' bytes on it"
    assert lines[3].split() == ["#", "ranks", "schedule", "images/s", "iter", "ms", "compute", "ms", "comm", "ms",
                                "hidden", "efficiency", "vs", "native", "wire", "ms", "bound", "ms", "x", "bound"]
    rows = {(int(r[0]), r[1]): r[2:] for r in (line.split() for line in lines[4:])}
    assert list(rows) == [(1, "single"), (2, "scaffe"), (2, "allreduce"), (2, "native")]
    for (ranks, schedule), (images, iter_ms, compute, comm, hidden, efficiency, versus, *bound) in rows.items():
        images, iter_ms, compute, comm = float(images), float(iter_ms), float(compute), float(comm)
        # images/s and ms per iteration describe the same run: 64 images per rank per iteration.
        assert images * iter_ms / 1e3 == pytest.approx(64 * ranks, rel=0.01)
        assert 0 < compute <= iter_ms * 1.01
        assert float(efficiency) == pytest.approx(images / (ranks * float(rows[(1, "single")][0])), abs=0.01)
        if ranks == 1:
            assert comm == 0 and hidden == "-" and versus == "-" and bound == ["-"] * 3
        else:
            # LeNet's 431080 float32 parameters on a link of 100 MB/s: 17.2 ms; the bound is the larger of it
            # and compute, and the last column the iteration over the bound.
            wire_ms, bound_ms, times = map(float, bound)
            assert wire_ms == pytest.approx(17.2, abs=0.05)
            assert bound_ms == pytest.approx(max(compute, wire_ms), abs=0.06)
            assert times == pytest.approx(iter_ms / bound_ms, abs=0.01 + 0.06 * iter_ms / bound_ms ** 2)
            assert comm > 0 and 0 <= float(hidden.rstrip("%")) <= 100
            assert float(versus) == pytest.approx(images / float(rows[(2, "native")][0]), abs=0.01)
    # The baseline communicates after backward only: measured, and none of it hidden.
    assert float(rows[(2, "native")][3]) > 0 and rows[(2, "native")][4] == "0%"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "lenet-1ranks-single-0.json", "lenet-2ranks-allreduce-0.json", "lenet-2ranks-native-0.json",
        "lenet-2ranks-scaffe-0.json"]
    native = timeline.summarize(timeline.load(tmp_path / "lenet-2ranks-native-0.json"))
    assert sorted(native["ranks"]) == [0, 1] and native["hidden_fraction"] == 0
    # LeNet's 1.7 MB of gradients fill two buckets (of at least 1 MiB, but the last), named by their layers in
    # the order backward filled them: ip1's travels during the convolutions' backward (the ranks' flags go apart).
    buckets = [(e["pid"], e["args"]["layers"]) for e in timeline.load(tmp_path / "lenet-2ranks-allreduce-0.json")
               ["traceEvents"] if e.get("cat") == "collective" and e["args"].get("carries") == "gradients"]
    assert buckets == [(rank, layers) for rank in (0, 1) for _ in range(2)
                       for layers in (["ip2", "ip1"], ["conv2", "conv1"])]


def test_train_scaling_alexnet_is_caffes_net_on_dummy_data():
    from perf.train_scaling import deploy_train_net
    from scaffe import io as sio
    net = deploy_train_net("alexnet", 8)
    deploy = sio.read_net_prototxt(str(ROOT / "examples" / "alexnet" / "deploy.prototxt"))
    assert [layer.type for layer in net.layer[1:-1]] == [layer.type for layer in deploy.layer[1:-1]]
    data, loss = net.layer[0], net.layer[-1]
    assert data.type == "DummyData" and list(data.top) == ["data", "label"]
    assert [list(s.dim) for s in data.dummy_data_param.shape] == [[8, 3, 227, 227], [8]]
    assert loss.type == "SoftmaxWithLoss" and list(loss.bottom) == ["fc8", "label"]


def test_train_scaling_cifar10_quick_trains_on_random_images():
    import numpy
    from perf.train_scaling import make_solver
    solver = make_solver("cifar10_quick", 4, 0)
    data, label = solver.net.input_blobs
    assert data.shape == (4, 3, 32, 32) and 0 < float(data.data.std()) and set(label.data) <= set(range(10))
    assert [blob.shape for blob in solver.net.learnable_params][-2:] == [(10, 64), (10,)]
    before = solver.net.learnable_params[0].data.copy()
    solver.step(1)
    assert numpy.isfinite(solver.smoothed_loss) and not numpy.array_equal(solver.net.learnable_params[0].data, before)
    solver.close()


def _trace():
    def x(pid, name, cat, tid, start, end):
        return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start, "dur": end - start}
    events = []
    for rank in (0, 1):
        events += [x(rank, "conv1", "forward", timeline.COMPUTE_TRACK, 0, 900),
                   x(rank, "wait data", "wait", timeline.DATA, 10, 200),
                   x(rank, "conv1", "backward", timeline.COMPUTE_TRACK, 1000, 2000),
                   x(rank, "update", "update", timeline.COMPUTE_TRACK, 2000, 2100),
                   x(rank, "Ireduce conv1", "collective", timeline.COLLECTIVES, 1500, 2500)]
    return {"traceEvents": events}


def test_plot_timeline_draws_a_row_per_rank_and_track(tmp_path):
    pytest.importorskip("matplotlib")
    from perf import plot_timeline
    out = tmp_path / "t.png"
    plot_timeline.plot(_trace(), out)
    import matplotlib.image
    picture = matplotlib.image.imread(out)
    assert picture.shape[0] > 200 and picture.shape[1] > 1000
    assert picture[..., :3].std() > 0  # not a blank canvas


def test_plot_timeline_says_matplotlib_is_missing(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(_trace()))
    code = ("import sys; sys.modules['matplotlib'] = None; from perf import plot_timeline; "
            f"plot_timeline.main([{str(trace)!r}, {str(tmp_path / 't.png')!r}])")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "needs matplotlib: pip install -e '.[plot]'" in done.stderr
