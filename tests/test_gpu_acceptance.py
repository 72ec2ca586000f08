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
MIB = 1 << 20


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses(script):
    done = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def dry_run_plan(tmp_path):
    done = subprocess.run(["bash", "jobs/gpu_acceptance.sh", "--dry-run", "--logs", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return {m.group(1): m.group(2) for m in re.finditer(r"^\+ \[(\w+)(?:, at most \d+s)?\] (.*)$", done.stdout, re.M)}


def test_dry_run_plans_every_log_the_verdict_reads(tmp_path):
    plan = dry_run_plan(tmp_path)
    for bench in ("reduce", "allreduce", "bcast"):
        for device in ("cuda", "cupy"):
            command = plan[f"osu_{bench}_{device}"]
            assert f"-n {gpu_acceptance.RANKS} " in command and f"perf.osu_{bench} -d {device}" in command
            assert "--impl both -m 4:268435456" in command
    for ranks, schedule in gpu_acceptance.TRAIN_RUNS:
        command = plan[f"train_lenet_np{ranks}_{schedule}"]
        assert "--gpu=0" in command and "lenet_solver.prototxt" in command
        assert (f"mpiexec -n {ranks} " in command and f"--schedule={schedule}" in command) if ranks > 1 \
            else "mpiexec" not in command
    assert "-m gpu tests" in plan["gpu_tests"] and "test_cuda_compile.py" in plan["compile_check"]
    assert plan["bounds"].endswith("perf.gpu_acceptance bounds")
    assert plan["time_scaffe"].endswith("scaffe-time") and plan["time_torch"].endswith("perf.torch_twins")
    assert plan["verdict"].endswith(f"verdict {tmp_path}")
    assert list(tmp_path.iterdir()) == []  # a dry run runs nothing


def osu_log(path, title, rows):
    """An OSU table as perf/osu.py prints it for `--impl both` on the GPU: {size: (staged us, scaffe us)}."""
    columns = osu.output_columns(SimpleNamespace(full=False, floor=False), ["staged", "scaffe"], "staged")
    lines = [f"# OSU MPI-CUDA {title} Latency Test (scaffe perf)", "# 4 ranks; ...",
             "# Size" + "".join(f"{t:>{width}}" for t, width, _ in columns)]
    for size, (staged, ours) in rows.items():
        stats = {"staged": (staged, staged, staged), "scaffe": (ours, ours, ours)}
        lines.append(f"{size:<10d}" + "".join(f"{value(stats, 5, None):>{width}}" for _, width, value in columns))
    path.write_text("\n".join(lines) + "\n")


def write_logs(logs, reduce_us, allreduce_us, accuracies, ms):
    """Logs shaped like a real run's: OSU tables, RESULT lines, training logs in Caffe's format."""
    for device in ("cuda", "cupy"):
        osu_log(logs / f"osu_reduce_{device}.log", "Reduce", {4: (30.0, 20.0), 64 * MIB: (60000.0, reduce_us)})
        osu_log(logs / f"osu_allreduce_{device}.log", "Allreduce",
                {size: (9e5, allreduce_us * size / (64 * MIB)) for size in gpu_acceptance.COPY_SIZES})
    bounds = [f"RESULT fused_sum4_us {64 * MIB} 200.00"]
    bounds += [f"RESULT d2d_copy_GBps {size} 3000.0" for size in gpu_acceptance.COPY_SIZES]
    (logs / "bounds.log").write_text("\n".join(bounds) + "\n")
    for (ranks, schedule), accuracy in zip(gpu_acceptance.TRAIN_RUNS, accuracies):
        (logs / f"train_lenet_np{ranks}_{schedule}.log").write_text(
            "I1125 10:00:00.000000  1 solver.cpp] Test net output #0: accuracy = 0.5\n"
            f"I1125 10:00:09.000000  1 solver.cpp] Test net output #0: accuracy = {accuracy}\n"
            "I1125 10:00:09.000000  1 solver.cpp] Test net output #1: loss = 0.05 (* 1 = 0.05 loss)\n")
    (logs / "time_scaffe.log").write_text("".join(f"RESULT scaffe_ms_per_iter {net} {ours}\n"
                                                  for net, (ours, _) in ms.items()))
    (logs / "time_torch.log").write_text("".join(f"RESULT torch_ms_per_iter {net} {torch}\n"
                                                 for net, (_, torch) in ms.items()))


def verdicts(logs):
    return {check: verdict for check, _, _, verdict in gpu_acceptance.verdict_rows(logs)}


def test_verdict_passes_a_run_that_meets_every_line(tmp_path, capsys):
    # 64 MiB x 8 (4 inputs read, 4 outputs written) in 200 us is 2684 GB/s: 89% of 3000 GB/s.
    write_logs(tmp_path, reduce_us=350.0, allreduce_us=200.0, accuracies=[0.98, 0.981, 0.975, 0.979, 0.985],
               ms={"lenet": (2.0, 1.5), "cifar10_quick": (3.0, 2.5), "alexnet": (40.0, 30.0)})
    found = verdicts(tmp_path)
    assert len(found) == 2 * (2 + len(gpu_acceptance.COPY_SIZES)) + len(gpu_acceptance.TRAIN_RUNS) + 3
    assert set(found.values()) == {"PASS"}, found
    assert gpu_acceptance.print_verdict(tmp_path) == 0
    table = capsys.readouterr().out
    assert re.search(r"^\| Reduce 64 MiB, 4 ranks, -d cuda: staged / scaffe +\| 171\.4x +\| >= 100x +\| PASS +\|$",
                     table, re.M), table
    assert table.splitlines()[-1] == "18 of 18 acceptance checks pass"


def test_verdict_fails_each_line_that_is_missed(tmp_path):
    # 60000/700 = 86x < 100x; 700/200 = 3.5x the kernel; 64 MiB x 8 in 250 us is 71% of the copy rate;
    # 4 ranks' allreduce accuracy off by 0.02; AlexNet 2x PyTorch.
    write_logs(tmp_path, reduce_us=700.0, allreduce_us=250.0, accuracies=[0.98, 0.981, 0.975, 0.979, 0.96],
               ms={"lenet": (2.0, 1.5), "cifar10_quick": (3.0, 2.5), "alexnet": (60.0, 30.0)})
    failed = {check for check, verdict in verdicts(tmp_path).items() if verdict == "FAIL"}
    assert failed == {"Reduce 64 MiB, 4 ranks, -d cuda: staged / scaffe", "Reduce 64 MiB, 4 ranks, -d cupy: staged / scaffe",
                      "Reduce 64 MiB, -d cuda: scaffe / one fused kernel", "Reduce 64 MiB, -d cupy: scaffe / one fused kernel",
                      *(f"Allreduce {s // MIB} MiB, -d {d}: memory rate / device copy rate"
                        for s in gpu_acceptance.COPY_SIZES for d in ("cuda", "cupy")),
                      "LeNet accuracy, 4 rank(s), allreduce", "alexnet ms/iter: scaffe 60.0 / PyTorch eager 30.0"}
    assert gpu_acceptance.print_verdict(tmp_path) == 1


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
    if name == "alexnet":
        param = train_scaling.alexnet_train_net(1)
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
