"""The `scaffe` command line: Caffe's flags, its log lines, exit codes and one-line errors."""
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scaffe import io as sio
from scaffe.cli import main
from image_folder import write_image_folder

REF = Path(__file__).resolve().parents[2].parent / "shared" / "caffe-reference"
ROOT = Path(__file__).resolve().parents[2]
needs_ref = pytest.mark.skipif(not REF.is_dir(), reason=f"Caffe reference files not found at {REF}")

GLOG = re.compile(r"^[IWEF]\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")


@pytest.fixture
def zoo_dir(tmp_path, monkeypatch):
    """A working folder like the reference one (relative paths resolve), writable, so snapshots
    land here and never in the reference folder."""
    if not REF.is_dir():
        pytest.skip(f"Caffe reference files not found at {REF}")
    for name in ("layer_zoo.prototxt", "digits_lmdb", "infogain_H.binaryproto", "layer_zoo_init.caffemodel",
                 "layer_zoo_iter_20.caffemodel", "solver_sgd_1iter.prototxt", "solver_sgd.prototxt",
                 "solver_adam_1iter.prototxt"):
        (tmp_path / name).symlink_to(REF / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def messages(err):
    """The message part of each glog-formatted line (checking every line has the prefix)."""
    out = []
    for line in err.splitlines():
        m = GLOG.match(line)
        if m:
            out.append(line[m.end():])
        elif out:
            out[-1] += "\n" + line
    return out


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@needs_ref
def test_train_prints_caffes_lines_and_writes_caffes_weights(zoo_dir, capsys):
    code, out, err = run(capsys, "train", "-solver", "solver_sgd_1iter.prototxt", "-weights", "layer_zoo_init.caffemodel")
    assert code == 0, err
    msgs = messages(err)
    assert msgs[0] == "Use CPU."
    expected_in_order = [
        r"Initializing solver from parameters: \n.*",
        r"Creating training net from net file: layer_zoo\.prototxt",
        r"Finetuning from layer_zoo_init\.caffemodel",
        r"Solver scaffolding done\.",
        r"Starting Optimization",
        r"Solving LayerZoo",
        r"Learning Rate Policy: step",
        r"Iteration 0 \([-\d.e+]+ iter/s, [\d.e+-]+s/1 iters\), loss = 7\.3623\d",
        r"    Train net output #0: acc = 0",
        r"    Train net output #6: loss = 2\.697\d+ \(\* 1 = 2\.697\d+ loss\)",
        r"Iteration 0, lr = 0\.01",
        r"Gradient clipping: scaling down gradients \(L2 norm 5\.078\d+ > 4\) by scale factor 0\.7876\d+",
        r"Snapshotting to binary proto file layer_zoo_sgd_iter_1\.caffemodel",
        r"Snapshotting solver state to binary proto file layer_zoo_sgd_iter_1\.solverstate",
        r"Iteration 1, loss = 7\.375\d+",
        r"Optimization Done\.",
        r"Optimization Done\.",
    ]
    pos = 0
    for pattern in expected_in_order:
        while pos < len(msgs) and not re.fullmatch(pattern, msgs[pos], re.S):
            pos += 1
        assert pos < len(msgs), f"no line matching {pattern!r} (in order)"
        pos += 1
    ours = sio.read_weights(zoo_dir / "layer_zoo_sgd_iter_1.caffemodel")
    ref = sio.read_weights(REF / "layer_zoo_sgd_iter_1.caffemodel")
    for layer, arrays in ref.items():
        for a, b in zip(ours[layer], arrays):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1, float(np.abs(b).max())))
    state = sio.read_solverstate(zoo_dir / "layer_zoo_sgd_iter_1.solverstate")
    assert state.iter == 1 and state.learned_net == "layer_zoo_sgd_iter_1.caffemodel"


@needs_ref
def test_train_resume_with_snapshot_flag_and_log_csv(zoo_dir, capsys):
    assert run(capsys, "train", "--solver=solver_sgd_1iter.prototxt", "--weights=layer_zoo_init.caffemodel")[0] == 0
    code, _, err = run(capsys, "train", "--solver=solver_sgd.prototxt", "--snapshot=layer_zoo_sgd_iter_1.solverstate",
                       "--iterations=4", "--log_csv=train.csv")
    assert code == 0, err
    msgs = messages(err)
    assert "Resuming from layer_zoo_sgd_iter_1.solverstate" in msgs
    assert "SGDSolver: restoring history" in msgs
    first = next(m for m in msgs if m.startswith("Iteration 1 ("))
    assert float(first.rsplit("= ", 1)[1]) == pytest.approx(7.16575, rel=2e-4)
    with open("train.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3]
    assert set(rows[0]) >= {"iteration", "seconds", "loss", "lr", "images_per_s"}
    assert float(rows[0]["loss"]) == pytest.approx(7.16575, rel=2e-4)
    assert float(rows[0]["lr"]) == pytest.approx(0.01)
    assert float(rows[0]["images_per_s"]) > 0
    assert (zoo_dir / "layer_zoo_iter_4.caffemodel").exists()


@needs_ref
def test_test_command_matches_caffe_test(zoo_dir, capsys):
    code, _, err = run(capsys, "test", "-model", "layer_zoo.prototxt", "-weights", "layer_zoo_iter_20.caffemodel",
                       "-iterations", "32")
    assert code == 0, err
    msgs = messages(err)
    wanted = re.compile(r"(Running for|Batch \d+,|Loss:|\w+ = )")
    ref = [line.split("] ", 1)[1] for line in (REF / "logs" / "caffe_test_iter20.log").read_text().splitlines()
           if "caffe.cpp:" in line and wanted.match(line.split("] ", 1)[1])]
    ours = [m for m in msgs if wanted.match(m)]
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        left_a, num_a = re.sub(r"[-\d.e+]+", "#", a), [float(x) for x in re.findall(r"\d[\d.e+-]*", a)]
        left_b, num_b = re.sub(r"[-\d.e+]+", "#", b), [float(x) for x in re.findall(r"\d[\d.e+-]*", b)]
        assert left_a == left_b, (a, b)
        assert num_a == pytest.approx(num_b, rel=2e-3, abs=1e-5), (a, b)


@needs_ref
def test_time_command_prints_caffes_table(zoo_dir, capsys):
    code, _, err = run(capsys, "time", "-model", "layer_zoo.prototxt", "-stage", "timing", "-iterations", "2")
    assert code == 0, err
    msgs = messages(err)
    assert msgs[0] == "Use CPU."
    assert any(re.fullmatch(r"Initial loss: [\d.]+", m) for m in msgs)
    assert "*** Benchmark begins ***" in msgs and "Testing for 2 iterations." in msgs
    assert [m for m in msgs if m.startswith("Iteration: ")][1].endswith(" ms.")
    table = [m for m in msgs if "\tforward: " in m or "\tbackward: " in m]
    ref = [line.split("] ", 1)[1] for line in (REF / "logs" / "caffe_time.log").read_text().splitlines()
           if "\tforward: " in line or "\tbackward: " in line]
    assert [re.sub(r"[\d.e+-]+ ms\.$", "T ms.", m) for m in table] == [re.sub(r"[\d.e+-]+ ms\.$", "T ms.", m) for m in ref]
    for what in ("Average Forward pass", "Average Backward pass", "Average Forward-Backward", "Total Time"):
        assert any(re.fullmatch(rf"{what}: [\d.e+-]+ ms\.", m) for m in msgs), what
    assert msgs[-1] == "*** Benchmark ends ***"


@needs_ref
def test_time_without_stage_runs_layers_without_backward(zoo_dir, capsys):
    """Caffe aborts here (Threshold and ArgMax have no Backward); scaffe's forward-only layers
    have a backward that does nothing, so the whole net can be timed."""
    code, _, err = run(capsys, "time", "-model", "layer_zoo.prototxt", "-iterations", "1")
    assert code == 0, err
    msgs = messages(err)
    assert any(m.startswith("    argmax\tbackward: ") for m in msgs)


@pytest.mark.parametrize("argv,fragment", [
    (["train"], "need a solver definition"),
    (["train", "--solver=missing_solver.prototxt"], "missing_solver.prototxt: no such file"),
    (["train", "--solver=s.prototxt", "--weights=a", "--snapshot=b"], "not both"),
    (["test", "--model=m.prototxt"], "need model weights"),
    (["time"], "need a model definition"),
])
def test_usage_errors_are_one_line(tmp_path, monkeypatch, capsys, argv, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert fragment in last and last.startswith(f"scaffe {argv[0]}: error: ")
    assert sum(line.startswith("scaffe ") for line in err.splitlines()) == 1


def _net_error(tmp_path, monkeypatch, capsys, net_text, *extra, weights=None):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(net_text)
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" max_iter: 1\n')
    argv = ["train", "--solver=solver.prototxt"] + ([f"--weights={weights}"] if weights else []) + list(extra)
    code, _, err = run(capsys, *argv)
    assert code == 1, err
    errors = [line for line in err.splitlines() if line.startswith("scaffe train: error: ")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    return errors[0]


def test_unknown_layer_type_error(tmp_path, monkeypatch, capsys):
    line = _net_error(tmp_path, monkeypatch, capsys, 'layer { name: "x" type: "Magic" top: "y" }')
    assert "net.prototxt" in line and "'x'" in line and "unknown layer type 'Magic'" in line


def test_missing_bottom_error(tmp_path, monkeypatch, capsys):
    line = _net_error(tmp_path, monkeypatch, capsys, """
        layer { name: "in" type: "Input" top: "a" input_param { shape { dim: 1 dim: 2 } } }
        layer { name: "act" type: "ReLU" bottom: "b" top: "c" }""")
    assert "net.prototxt" in line and "'act'" in line and "'b'" in line


def test_missing_data_path_error(tmp_path, monkeypatch, capsys):
    line = _net_error(tmp_path, monkeypatch, capsys, """
        layer { name: "db" type: "Data" top: "data" top: "label"
          data_param { source: "no_such_lmdb" batch_size: 4 backend: LMDB } }""")
    assert "net.prototxt" in line and "'db'" in line and "no_such_lmdb" in line


def test_weights_shape_mismatch_error(tmp_path, monkeypatch, capsys):
    net = """
        layer { name: "in" type: "DummyData" top: "a" top: "t"
          dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: %d } } }
        layer { name: "fc" type: "InnerProduct" bottom: "a" top: "y" inner_product_param { num_output: %d } }
        layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }"""
    monkeypatch.chdir(tmp_path)
    from scaffe.net import Net
    small = Net(sio.parse_net_text(net % (2, 2)), "TRAIN")
    small.save(tmp_path / "small.caffemodel")
    line = _net_error(tmp_path, monkeypatch, capsys, net % (5, 5), weights="small.caffemodel")
    assert "small.caffemodel" in line and "'fc'" in line and "shape mismatch" in line


def test_unknown_command_and_help(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "scaffe train --solver" in capsys.readouterr().out


def test_python_dash_m_scaffe_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scaffe", "device_query"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "logical cores" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "scaffe", "train", "-solver", str(tmp_path / "none.prototxt")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("scaffe train: error: ")


def test_convert_mnist_and_compute_image_mean(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "convert", "mnist")
    assert code == 0, err
    assert (tmp_path / "examples" / "mnist" / "mnist_train_lmdb").is_dir()
    assert (tmp_path / "examples" / "mnist" / "mnist_test_lmdb").is_dir()
    code, _, err = run(capsys, "compute_image_mean", "examples/mnist/mnist_test_lmdb", "mean.binaryproto")
    assert code == 0, err
    mean = sio.read_mean_file(tmp_path / "mean.binaryproto")
    assert mean.shape == (1, 28, 28) and 0 < mean.mean() < 255


def test_convert_imageset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path, 3)
    code, _, err = run(capsys, "convert", "imageset", "img/", "list.txt", "imgs_lmdb", "-resize_height", "4",
                       "-resize_width", "4")
    assert code == 0, err
    from scaffe.data.lmdb_reader import open_database
    db = open_database(str(tmp_path / "imgs_lmdb"))
    assert len(db) == 3
    db.close()


@needs_ref
def test_log_csv_has_test_columns(zoo_dir, capsys):
    (zoo_dir / "solver_test.prototxt").write_text(
        'net: "layer_zoo.prototxt" base_lr: 0.01 lr_policy: "fixed" momentum: 0.9 max_iter: 3 display: 1\n'
        'test_iter: 2 test_interval: 2 snapshot_after_train: false random_seed: 3 solver_mode: CPU\n')
    code, _, err = run(capsys, "train", "-solver=solver_test.prototxt", "-weights=layer_zoo_init.caffemodel",
                       "-log_csv=log.csv")
    assert code == 0, err
    msgs = messages(err)
    assert "Iteration 0, Testing net (#0)" in msgs and "Iteration 2, Testing net (#0)" in msgs
    assert "Iteration 3, Testing net (#0)" not in msgs  # 3 is not a multiple of test_interval
    with open(zoo_dir / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["iteration"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["test0_acc"] != "" and rows[1]["test0_acc"] == "" and rows[2]["test0_loss"] != ""
    assert 0 < float(rows[0]["test0_loss"]) < 10 and 0 <= float(rows[2]["test0_acc"]) <= 1


def test_gpu_ids_are_parsed_and_checked_in_one_place():
    from scaffe.cli import CliError, _gpu_ids
    assert _gpu_ids("1", 2) == [1] and _gpu_ids("0,1", 2) == [0, 1]
    assert _gpu_ids("all", 3) == [0, 1, 2] and _gpu_ids("", 2) == [0, 1]
    for flag, fragment in (("x", "give device ids like 0 or 0,1, or all"), (",", "give device ids"),
                           ("0,2", "device 2 does not exist (2 GPU(s) here)")):
        with pytest.raises(CliError, match=re.escape(f"--gpu={flag}: {fragment}")):
            _gpu_ids(flag, 2)


def test_usage_lists_every_registered_command(capsys):
    from scaffe.cli import COMMANDS
    assert main([]) == 2
    lines = capsys.readouterr().out.splitlines()
    for command in COMMANDS:
        assert any(line.startswith(f"  {command} ") for line in lines), command


CHAIN_NET = """
layer {{ name: "in" type: "DummyData" top: "a" top: "t"
  dummy_data_param {{ shape {{ dim: 2 dim: 3 }} shape {{ dim: 2 dim: {out} }}
                      data_filler {{ type: "gaussian" }} data_filler {{ type: "constant" value: 1 }} }} }}
{layers}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "{last}" bottom: "t" top: "loss" }}
"""
CHAIN_LAYERS = {"fc1": (3, 4), "fc2": (4, 4), "fc3": (4, 2)}  # name: (inputs, outputs)


def chain_net(*names):
    """A DummyData net through the InnerProduct layers `names` (of CHAIN_LAYERS) to a Euclidean loss."""
    layers, bottom = [], "a"
    for name in names:
        layers.append(f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{name}" '
                      f'inner_product_param {{ num_output: {CHAIN_LAYERS[name][1]} '
                      f'weight_filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }} }}')
        bottom = name
    return CHAIN_NET.format(layers="\n".join(layers), last=bottom, out=CHAIN_LAYERS[names[-1]][1])


def save_chain(path, *names):
    from scaffe.net import Net
    with Net(sio.parse_net_text(chain_net(*names)), "TRAIN") as net:
        net.save(path)
    return sio.read_weights(path)


def test_comma_separated_weights_load_in_turn_and_the_warning_is_true(tmp_path, monkeypatch, capsys):
    """Caffe's LoadNetWeights: each file in turn, a later one overwriting the layers it holds; only a
    layer that no file holds keeps its filler values, and the one warning says so."""
    monkeypatch.chdir(tmp_path)
    first = save_chain(tmp_path / "a.caffemodel", "fc1", "fc2")
    second = save_chain(tmp_path / "b.caffemodel", "fc1")
    (tmp_path / "net.prototxt").write_text(chain_net("fc1", "fc2", "fc3"))
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0 lr_policy: "fixed" max_iter: 1 '
                                              'snapshot_prefix: "chain"\n')
    code, _, err = run(capsys, "train", "--solver=solver.prototxt", "--weights=a.caffemodel,b.caffemodel")
    assert code == 0, err
    msgs = messages(err)
    assert msgs.index("Finetuning from a.caffemodel") < msgs.index("Finetuning from b.caffemodel")
    warnings = [line for line in err.splitlines() if line.startswith("W")]
    assert len(warnings) == 1 and "'fc3'" in warnings[0] and "'fc2'" not in warnings[0], warnings
    assert "a.caffemodel, b.caffemodel have no weights" in warnings[0], warnings
    trained = sio.read_weights(tmp_path / "chain_iter_1.caffemodel")  # base_lr 0: the loaded values
    for name, source in (("fc1", second), ("fc2", first)):
        for got, want in zip(trained[name], source[name]):
            np.testing.assert_array_equal(got, want)


def test_test_command_logs_each_batch_as_it_ends(tmp_path, monkeypatch, capsys):
    import logging

    from scaffe.log import get_logger
    from scaffe.net import Net
    monkeypatch.chdir(tmp_path)
    save_chain(tmp_path / "w.caffemodel", "fc1")
    (tmp_path / "net.prototxt").write_text(chain_net("fc1"))
    events = []
    real_forward = Net.forward
    monkeypatch.setattr(Net, "forward", lambda net, *a, **k: events.append("forward") or real_forward(net, *a, **k))

    class Recorder(logging.Handler):
        def emit(self, record):
            events.append(record.getMessage())

    recorder = Recorder()
    get_logger().addHandler(recorder)
    try:
        code, _, err = run(capsys, "test", "--model=net.prototxt", "--weights=w.caffemodel", "--iterations=3")
    finally:
        get_logger().removeHandler(recorder)
    assert code == 0, err
    order = [e if e == "forward" else e.split(",")[0] for e in events if e == "forward" or e.startswith("Batch ")]
    assert order == ["forward", "Batch 0", "forward", "Batch 1", "forward", "Batch 2"]


def test_glog_settings_apply_to_every_command_and_tool(tmp_path, monkeypatch, capsys):
    """GLOG_minloglevel, GLOG_logtostderr, GLOG_log_dir and their flags (which win), as Caffe's tools take them."""
    from scaffe.cli import tool_script
    from scaffe.log import setup_logging
    from scaffe.tools.convert_mnist import bundled_mnist_dir
    monkeypatch.chdir(tmp_path)
    save_chain(tmp_path / "w.caffemodel", "fc1")
    (tmp_path / "net.prototxt").write_text(chain_net("fc1", "fc3"))  # fc3 is not in w: one warning
    scoring = ["test", "--model=net.prototxt", "--weights=w.caffemodel", "--iterations=1"]

    def letters(*argv):
        """The severity letters of the glog lines a command logs (its only output)."""
        code, out, err = run(capsys, *argv)
        assert code == 0 and not out and (not err or GLOG.match(err)), err
        return {line[0] for line in err.splitlines() if GLOG.match(line)}

    data = bundled_mnist_dir()
    assert letters("convert_mnist_data", data / "t10k-images-idx3-ubyte.gz", data / "t10k-labels-idx1-ubyte.gz",
                   "digits") == {"I"}
    assert letters(*scoring) == {"I", "W"}
    monkeypatch.setenv("GLOG_minloglevel", "1")
    assert letters(*scoring) == {"W"}
    assert letters("compute_image_mean", "digits", "mean.binaryproto") == set()
    assert letters(*scoring, "--minloglevel=2") == set()
    assert letters("-minloglevel", "0", *scoring) == {"I", "W"}
    assert letters("compute_image_mean", "--minloglevel", "0", "digits") == {"I"}
    code, _, err = run(capsys, "convert_imageset", "--nologtostderr", "--minloglevel=3", "root/", "no_list", "db")
    assert code == 1 and err.startswith("convert_imageset: ") and "no_list" in err, err  # errors always show
    monkeypatch.setenv("GLOG_minloglevel", "often")
    code, _, err = run(capsys, *scoring)
    assert code == 1 and err == "scaffe test: error: GLOG_minloglevel must be a severity number (0 INFO, " \
                                "1 WARNING, 2 ERROR, 3 FATAL), got 'often'\n"
    monkeypatch.delenv("GLOG_minloglevel")

    # Log files: glog's names, one per severity holding that severity and above, only where log_dir says.
    monkeypatch.setenv("GLOG_log_dir", str(tmp_path / "logs"))
    try:
        monkeypatch.setattr(sys, "argv", ["/usr/bin/convert_mnist_data", str(data / "t10k-images-idx3-ubyte.gz"),
                                          str(data / "t10k-labels-idx1-ubyte.gz"), "digits2"])
        assert tool_script() == 0
        capsys.readouterr()
        assert run(capsys, *scoring)[0] == 0
        files = sorted(p.name for p in (tmp_path / "logs").iterdir())
        assert [f for f in files if "." not in f.partition(".")[2]] == [
            "convert_mnist_data.INFO", "scaffe.INFO", "scaffe.WARNING"]
        info = (tmp_path / "logs" / "convert_mnist_data.INFO").read_text().splitlines()
        assert info[0].startswith("Log file created at: ") and GLOG.match(info[3])
        assert info[-1].endswith("] A total of 1000 items.")
        warning = (tmp_path / "logs" / "scaffe.WARNING").read_text()
        assert "'fc3'" in warning and "] Running for 1 iterations." not in warning
        assert "] Running for 1 iterations." in (tmp_path / "logs" / "scaffe.INFO").read_text()
        assert re.fullmatch(r"scaffe\.[\w.-]+\.log\.INFO\.\d{8}-\d{6}\.\d+", os.readlink(tmp_path / "logs" / "scaffe.INFO"))
        monkeypatch.setenv("GLOG_log_dir", str(tmp_path / "other"))
        assert run(capsys, *scoring, "--logtostderr")[0] == 0
        assert not (tmp_path / "other").exists()
    finally:
        monkeypatch.delenv("GLOG_log_dir")
        setup_logging()  # closes the log files


def test_glog_flags_are_taken_in_every_gflags_spelling(capsys):
    from scaffe.log import take_glog_flags
    rest, flags = take_glog_flags(["train", "-minloglevel=1", "--solver", "s", "-log_dir", "d", "--nologtostderr"])
    assert rest == ["train", "--solver", "s"] and flags == {"minloglevel": "1", "log_dir": "d", "logtostderr": "false"}
    assert take_glog_flags(["--logtostderr", "x", "-logtostderr=0"]) == (["x"], {"logtostderr": "0"})
    assert main(["test", "--log_dir"]) == 2 and capsys.readouterr().err == "scaffe: --log_dir needs a value\n"
