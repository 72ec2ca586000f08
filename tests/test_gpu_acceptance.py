"""jobs/gpu_acceptance.sh as far as it can be checked without a GPU: its shell parses, its dry run plans
every step the verdict reads, the verdict judges real-format logs right, and the PyTorch twins have the
learnable shapes of scaffe's own nets."""
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from perf import gpu_acceptance, osu, torch_twins

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["jobs/gpu_acceptance.sh", "jobs/fetch_gpu_wheels.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses(script):
    done = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def dry_run_plan(tmp_path, *flags):
    """{step: (limit in s, command)} of the script's dry run."""
    done = subprocess.run(["bash", "jobs/gpu_acceptance.sh", "--dry-run", "--logs", str(tmp_path), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return {m.group(1): (int(m.group(2) or 0), m.group(3))
            for m in re.finditer(r"^\+ \[(\w+)(?:, at most (\d+)s)?\] (.*)$", done.stdout, re.M)}


def test_dry_run_plans_every_log_the_verdict_reads(tmp_path):
    plan = {name: command for name, (_, command) in dry_run_plan(tmp_path).items()}
    for bench in ("reduce", "allreduce", "bcast"):
        for device in gpu_acceptance.DEVICES:
            command = plan[f"osu_{bench}_{device}"]
            assert f"-n {gpu_acceptance.RANKS} " in command and f"perf.osu_{bench} -d {device}" in command
            assert f"--impl both -m 4:{gpu_acceptance.LARGEST}" in command
    for net, runs in gpu_acceptance.TRAIN_RUNS.items():
        for ranks, schedule in runs:
            command = plan[f"train_{net}_np{ranks}_{schedule}"]
            solver = "examples/mnist/lenet_solver.prototxt" if net == "lenet" else f"{tmp_path}/cifar_digits/solver.prototxt"
            assert f"--solver={solver} --gpu=0 " in command
            assert (f"mpiexec -n {ranks} " in command and f"--schedule={schedule}" in command) if ranks > 1 \
                else "mpiexec" not in command
    assert "-m gpu tests" in plan["gpu_tests"]
    assert plan["cifar_digits"].endswith(f"cifar-digits {tmp_path}/cifar_digits --iterations=500")
    assert plan["bounds"].endswith("perf.gpu_acceptance bounds")
    assert plan["time_scaffe"].endswith("scaffe-time") and plan["time_torch"].endswith("perf.torch_twins")
    assert plan["verdict"].endswith(f"verdict {tmp_path}")
    assert list(tmp_path.iterdir()) == []  # a dry run runs nothing


@pytest.mark.parametrize("budget", [None, 300, 900])
def test_step_limits_fit_the_budget_and_the_verdicts_needs_come_first(tmp_path, budget):
    plan = dry_run_plan(tmp_path, *(["--budget", str(budget)] if budget else []))
    limits = {name: limit for name, (limit, _) in plan.items() if limit}
    assert sum(limits.values()) <= (budget or 450) - 15  # 15 s kept back for the verdict
    order = list(limits)
    assert order[:5] == ["bounds", "osu_reduce_cupy", "osu_allreduce_cupy", "osu_reduce_cuda", "osu_allreduce_cuda"]
    assert order.index("gpu_tests") < order.index("osu_bcast_cupy") < order.index("train_lenet_np1_scaffe")


MIB = 1 << 20
SIZES = [4 << k for k in range(27)]  # 4 B to 256 MiB, as the script asks
COPY_GBPS = 3000.0
KERNEL_US = {size: size / MIB * 1.9 for size in SIZES}  # 64 MiB: 121.6 us


def allreduce_us(size, fraction):
    """The time an Allreduce of `size` takes at `fraction` of the copy rate for its traffic (P read, P written)."""
    return 2 * gpu_acceptance.RANKS * size / (fraction * COPY_GBPS * 1e9) * 1e6


def osu_log(path, title, ours, failure=None):
    """An OSU table as perf/osu.py prints it for `--impl both` on the GPU, staged 3x slower than `ours`
    ({size: scaffe us}); `failure` lines follow the rows (a crash)."""
    columns = osu.output_columns(SimpleNamespace(full=False, floor=False), ["staged", "scaffe"], "staged")
    lines = [f"# OSU MPI-CUDA {title} Latency Test (scaffe perf)", "# 4 ranks; ...",
             "# Size" + "".join(f"{t:>{width}}" for t, width, _ in columns)]
    for size, us in ours.items():
        stats = {"staged": (3 * us, 3 * us, 3 * us), "scaffe": (us, us, us)}
        lines.append(f"{size:<10d}" + "".join(f"{value(stats, 5, None):>{width}}" for _, width, value in columns))
    path.write_text("\n".join(lines + (failure or [])) + "\n")


def passing_times(small=20.0, reduce_factor=1.1, allreduce_fraction=0.8, bcast_factor=1.2):
    """{bench: {size: scaffe us}} of a run that meets (or with other factors, misses) every line."""
    copies_us = (gpu_acceptance.RANKS - 1) * 2 * gpu_acceptance.BCAST_SIZE / (COPY_GBPS * 1e9) * 1e6
    return {"reduce": {size: max(small, reduce_factor * KERNEL_US[size]) for size in SIZES},
            "allreduce": {size: max(small, allreduce_us(size, allreduce_fraction)) for size in SIZES},
            "bcast": {size: (bcast_factor * copies_us if size == gpu_acceptance.BCAST_SIZE else small)
                      for size in SIZES}}


def write_logs(logs, times, accuracies=None, ms=None, failed_steps=()):
    """Logs shaped like a real run's: OSU tables, RESULT lines, pytest's summary, Caffe-format training logs,
    and the script's steps.tsv (every step exit 0 but `failed_steps`: {name: status})."""
    steps = {"bounds": 0, "gpu_tests": 0, "time_scaffe": 0, "time_torch": 0}
    for device in gpu_acceptance.DEVICES:
        for bench, ours in times.items():
            osu_log(logs / f"osu_{bench}_{device}.log", bench.capitalize(), ours)
            steps[f"osu_{bench}_{device}"] = 0
    bounds = [f"RESULT fused_sum4_us {size} {KERNEL_US[size]:.2f}" for size in gpu_acceptance.KERNEL_SIZES]
    bounds += [f"RESULT fused_allreduce4_us {size} {allreduce_us(size, 0.9):.2f}" for size in gpu_acceptance.ALLREDUCE_SIZES]
    bounds += [f"RESULT d2d_copy_GBps {size} {COPY_GBPS}" for size in gpu_acceptance.ALLREDUCE_SIZES]
    (logs / "bounds.log").write_text("\n".join(bounds) + "\n")
    (logs / "gpu_tests.log").write_text("......................\n22 passed in 81.20s (0:01:21)\n")
    accuracies = accuracies or {}
    for net, runs in gpu_acceptance.TRAIN_RUNS.items():
        for ranks, schedule in runs:
            name = f"train_{net}_np{ranks}_{schedule}"
            accuracy = accuracies.get(name, 0.98 if net == "lenet" else 0.71)
            (logs / f"{name}.log").write_text(
                "I1125 10:00:00.000000  1 solver.cpp] Test net output #0: accuracy = 0.5\n"
                f"I1125 10:00:09.000000  1 solver.cpp] Test net output #0: accuracy = {accuracy}\n"
                "I1125 10:00:09.000000  1 solver.cpp] Test net output #1: loss = 0.05 (* 1 = 0.05 loss)\n")
            steps[name] = 0
    ms = ms or {net: (2.0, 2.5) for net in gpu_acceptance.TIMED_NETS}
    (logs / "time_scaffe.log").write_text("".join(f"RESULT scaffe_ms_per_iter {n} {ours}\n"
                                                  f"RESULT scaffe_eager_ms_per_iter {n} {1.5 * ours}\n"
                                                  for n, (ours, _) in ms.items()))
    (logs / "time_torch.log").write_text("".join(f"RESULT torch_ms_per_iter {n} {torch}\n" for n, (_, torch) in ms.items()))
    steps.update(failed_steps)
    (logs / "steps.tsv").write_text("".join(f"{name}\t{status}\n" for name, status in steps.items()))


def verdicts(logs):
    return {check: verdict for check, _, _, verdict in gpu_acceptance.verdict_rows(logs)}


def test_verdict_passes_a_run_that_meets_every_line(tmp_path, capsys):
    write_logs(tmp_path, passing_times())
    found = verdicts(tmp_path)
    devices = len(gpu_acceptance.DEVICES)
    per_device = 2 + len(gpu_acceptance.MAX_REDUCE_VS_KERNEL) + len(gpu_acceptance.ALLREDUCE_SIZES) + 1 + 3
    training = sum(len(runs) for runs in gpu_acceptance.TRAIN_RUNS.values())
    assert len(found) == devices * per_device + 1 + training + 2 * len(gpu_acceptance.TIMED_NETS)
    assert set(found.values()) == {"PASS"}, found
    assert gpu_acceptance.print_verdict(tmp_path) == 0
    table = capsys.readouterr().out
    assert re.search(r"^\| Reduce 64 MiB, -d cuda: scaffe / one fused kernel +\| 1\.10x +\| <= 1\.3x +\| PASS +\|$",
                     table, re.M), table
    assert re.search(r"^\| Allreduce 16 MiB, -d cupy: memory rate / device copy rate +\| 80% \(fused kernel: 90%\) ",
                     table, re.M), table
    assert table.splitlines()[-1] == f"{len(found)} of {len(found)} acceptance checks pass (0 fail, 0 missing)"


def test_verdict_fails_each_line_that_is_missed(tmp_path):
    # 4 B in 60 us; Reduce 1.4x the kernel; Allreduce at 70% of the copy rate; Bcast 1.5x the copies;
    # 4 ranks of LeNet 0.02 off one rank; AlexNet slower than PyTorch.
    times = passing_times(small=60.0, reduce_factor=1.4, allreduce_fraction=0.7, bcast_factor=1.5)
    write_logs(tmp_path, times, accuracies={"train_lenet_np4_allreduce": 0.96},
               ms={net: (3.0 if net == "alexnet" else 2.0, 2.5) for net in gpu_acceptance.TIMED_NETS})
    failed = {check for check, verdict in verdicts(tmp_path).items() if verdict == "FAIL"}
    expected = set()
    for device in gpu_acceptance.DEVICES:
        expected |= {f"Reduce 4 B, -d {device}: scaffe us", f"Allreduce 4 B, -d {device}: scaffe us",
                     f"Bcast 64 MiB, -d {device}: scaffe / 3 device copies",
                     *(f"Reduce {s // MIB} MiB, -d {device}: scaffe / one fused kernel"
                       for s in gpu_acceptance.KERNEL_SIZES),
                     *(f"Allreduce {s // MIB} MiB, -d {device}: memory rate / device copy rate"
                       for s in gpu_acceptance.ALLREDUCE_SIZES)}
    expected |= {"lenet accuracy, 4 rank(s), allreduce", "alexnet ms/iter: scaffe 3.0 / PyTorch eager 2.5"}
    assert failed == expected
    assert gpu_acceptance.print_verdict(tmp_path) == 1


def test_a_crashed_or_skipped_step_gives_fail_and_missing_rows_and_the_table_is_printed(tmp_path, capsys):
    """The OSU -d cuda Reduce crashed after 1 MiB (issue 22's cudaErrorAlreadyMapped), its traceback in the log
    (one line of it has as many words as a row); the gpu tests never ran; the 4-rank LeNet timed out."""
    write_logs(tmp_path, passing_times(), failed_steps={"osu_reduce_cuda": 1, "gpu_tests": "skipped",
                                                         "train_lenet_np4_scaffe": 124})
    (tmp_path / "gpu_tests.log").unlink()
    (tmp_path / "train_lenet_np4_scaffe.log").write_text("I1125 10:00:00.000000  1 solver.cpp] Solving LeNet\n")
    crash = ["Traceback (most recent call last):", '  File "collectives/devices/peers.py", line 88, in open',
             "RuntimeError: cudaErrorAlreadyMapped (peer 2)", "4194304 Abort(1) on node 2"]
    osu_log(tmp_path / "osu_reduce_cuda.log", "Reduce", {s: 20.0 for s in SIZES if s <= MIB}, failure=crash)
    found = verdicts(tmp_path)
    assert found["Reduce 4 B, -d cuda: scaffe us"] == "PASS"  # measured before the crash
    for check in ("Reduce 64 MiB, -d cuda: scaffe / one fused kernel", "lenet accuracy, 4 rank(s), scaffe",
                  "Reduce -d cuda: every size 4 B to 256 MiB at least as fast as staged"):
        assert found[check] == "FAIL", check
    assert found["every `gpu`-marked test passes"] == "MISSING"
    assert found["Reduce 64 MiB, -d cupy: scaffe / one fused kernel"] == "PASS"
    assert gpu_acceptance.print_verdict(tmp_path) == 1
    table = capsys.readouterr().out
    assert "| - (osu_reduce_cuda (exit 1) failed) " in table and "| 1 of 1 sizes slower" not in table
    assert "| 0 of 19 sizes slower, up to 1048576 B " in table


def test_a_failing_gpu_test_fails_its_row(tmp_path):
    write_logs(tmp_path, passing_times(), failed_steps={"gpu_tests": 1})
    (tmp_path / "gpu_tests.log").write_text("FAILED tests/x.py::test_y - assert 1 == 2\n1 failed, 21 passed in 80s\n")
    assert verdicts(tmp_path)["every `gpu`-marked test passes"] == "FAIL"
    write_logs(tmp_path, passing_times())  # pytest exits 0 when every test skips: no GPU after all
    (tmp_path / "gpu_tests.log").write_text("sssssssssssssssssssssss\n23 skipped, 1171 deselected in 4.87s\n")
    assert verdicts(tmp_path)["every `gpu`-marked test passes"] == "FAIL"


def test_verdict_says_missing_for_what_did_not_run(tmp_path):
    assert set(verdicts(tmp_path).values()) == {"MISSING"}
    assert gpu_acceptance.print_verdict(tmp_path) == 1


def test_osu_takes_cupy_buffers_and_scaffes_staged_path():
    args = osu.parse_args("t", ["-d", "cupy", "--impl", "staged"])
    assert args.device in osu.DEVICES and args.impl == "staged"
    with pytest.raises(SystemExit):
        osu.parse_args("t", ["-d", "cpu", "--impl", "staged"])


def our_net_shapes(name):
    from perf import bench_train, train_scaling
    from scaffe.net import Net
    from scaffe.proto import caffe_pb2
    if name in ("alexnet", "googlenet"):
        param = train_scaling.deploy_train_net(name, 1)
    else:
        path, _, image = bench_train.MODELS[name]
        param = bench_train.synthetic_train_net(path, 1, image)
    for layer in param.layer:  # constant weights: only the shapes matter, and AlexNet's fillers are slow
        for field in ("convolution_param", "inner_product_param"):
            if layer.HasField(field):
                getattr(layer, field).weight_filler.type = "constant"
    net = Net(param, phase=caffe_pb2.TRAIN)
    return [tuple(p.data.shape) for p in net.learnable_params]


@pytest.mark.parametrize("name", sorted(torch_twins.SPECS))
def test_torch_twin_has_our_nets_learnable_shapes(name):
    assert torch_twins.param_shapes(name) == our_net_shapes(name)


@pytest.mark.parametrize("name", sorted(torch_twins.SPECS))
def test_torch_twin_builds_the_specified_shapes(name):
    torch = pytest.importorskip("torch")
    model = torch_twins.build(name)
    assert [tuple(p.shape) for p in model.parameters()] == torch_twins.param_shapes(name)
    batch, image, _ = torch_twins.SPECS[name]
    classes = torch_twins.param_shapes(name)[-1][0]
    assert tuple(model(torch.zeros((2, *image))).shape) == (2, classes)


def test_cifar10_quick_gets_the_bundled_digits_drawn_cifar_sized(tmp_path):
    from google.protobuf import text_format

    from scaffe.data.datum import datum_to_array
    from scaffe.data.lmdb_reader import open_database
    from scaffe.io import read_blobproto
    from scaffe.proto import caffe_pb2
    from scaffe.tools.convert_mnist import bundled_mnist_dir, read_idx_images, read_idx_labels
    solver = caffe_pb2.SolverParameter()
    text_format.Parse(gpu_acceptance.cifar_digits(tmp_path, 300).read_text(), solver)
    assert solver.max_iter == solver.test_interval == 300 and solver.test_iter == [10]
    assert solver.net_param.name == "CIFAR10_quick" and not solver.snapshot_after_train
    sources = {layer.include[0].phase: layer.data_param.source for layer in solver.net_param.layer
               if layer.type == "Data"}
    db = open_database(sources[caffe_pb2.TRAIN])
    try:
        key, value = next(iter(db.items()))
        image, label = datum_to_array(value)
    finally:
        db.close()
    digits = read_idx_images(bundled_mnist_dir() / "train-images-idx3-ubyte.gz")
    assert image.shape == (3, 32, 32) and (image[:, 2:30, 2:30] == digits[0]).all() and not image[:, :2].any()
    assert label == read_idx_labels(bundled_mnist_dir() / "train-labels-idx1-ubyte.gz")[0]
    mean = read_blobproto(str(tmp_path / "mean.binaryproto"))
    assert (mean.num, mean.channels, mean.height, mean.width) == (1, 3, 32, 32)
    assert {caffe_pb2.TRAIN, caffe_pb2.TEST} == set(sources)


SMALL_NET = """name: "small"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 }
                     data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 6 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "norm" type: "LRN" bottom: "conv" top: "norm" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layer { name: "fc" type: "InnerProduct" bottom: "norm" top: "fc"
  inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def test_layer_times_log_is_what_the_model_check_reads(cupy_stand_in, tmp_path, capsys):
    from perf import layer_times, model_check
    net = tmp_path / "small.prototxt"
    net.write_text(SMALL_NET)
    assert layer_times.main(["--model", str(net), "--repeats", "2", "--warmup", "1"]) == 0
    log = tmp_path / "layers.log"
    log.write_text(capsys.readouterr().out)
    rows, summary = model_check.compare(str(log), str(net))
    assert [(name, direction) for name, _, direction, _, _ in rows] == [
        (name, direction) for name in ("conv", "norm", "fc", "loss") for direction in ("forward", "backward")]
    assert summary["batch"] == 4 and summary["measured_ms"] > 0 and 0 < summary["fitted_efficiency"] <= 1
