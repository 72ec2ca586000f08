"""parse_log (Caffe's tools/extra/parse_log.py): Caffe's own training log and small logs in both glog date
formats to <log>.train / <log>.test rows, the values read off the log lines; the PNG of the curves."""
import math
import re
from pathlib import Path

import pytest

from scaffe import cli
from scaffe.tools.parse_log import parse_log

REF_LOG = Path(__file__).resolve().parents[2].parent / "shared" / "caffe-reference" / "logs" / "caffe_train_sgd.log"
needs_ref = pytest.mark.skipif(not REF_LOG.is_file(), reason="caffe-reference folder not present")

OUTPUTS = ["acc", "acc_top3", "center", "eucl", "hinge", "infogain", "loss", "loss_ign", "mlog", "sce"]


def check_sgd_rows(train, test):
    assert test == []
    assert [row["NumIters"] for row in train] == [float(i) for i in range(20)]
    assert all(list(row) == ["NumIters", "Seconds", "LearningRate"] + OUTPUTS for row in train)
    # Iteration 0: outputs from 08:32:31.835608, Solving at 08:32:31.831355; lr = 0.01 (the second row's).
    assert train[0] == {"NumIters": 0.0, "Seconds": 0.004253, "LearningRate": 0.01, "acc": 0.0, "acc_top3": 0.125,
                        "center": 1.63481, "eucl": 2.2498, "hinge": 9.60223, "infogain": 2.9452, "loss": 2.6977,
                        "loss_ign": 2.30332, "mlog": 2.6977, "sce": 26.6851}
    # Iteration 19 at 08:32:31.898106, with the rate printed after iteration 18 ("Iteration 18, lr = 0.005").
    assert train[19]["Seconds"] == 0.066751 and train[19]["LearningRate"] == 0.005
    assert (train[19]["eucl"], train[19]["loss"], train[19]["sce"]) == (0.0613892, 2.37038, 16.2094)


@needs_ref
def test_caffes_training_log_with_glog_07_dates():
    check_sgd_rows(*parse_log(REF_LOG))


@needs_ref
def test_the_same_log_with_old_glog_dates(tmp_path):
    old = tmp_path / "caffe.INFO"
    old.write_text(re.sub(r"^([IWEF])\d{4}(\d{4} )", r"\1\2", REF_LOG.read_text(), flags=re.MULTILINE))
    assert old.read_text().startswith("I1123 08:32:31.818061 ")
    check_sgd_rows(*parse_log(old))


TINY_LOG = """\
{p}1231 23:59:59.400000  1234 caffe.cpp:197] Use CPU.
{p}1231 23:59:59.500000  1234 solver.cpp:289] Solving TinyNet
{p}1231 23:59:59.500100  1234 solver.cpp:290] Learning Rate Policy: step
{p}1231 23:59:59.600000  1234 solver.cpp:347] Iteration 0, Testing net (#0)
{p}1231 23:59:59.700000  1234 solver.cpp:414]     Test net output #0: accuracy = 0.125
{p}1231 23:59:59.700010  1234 solver.cpp:414]     Test net output #1: loss = 2.31 (* 1 = 2.31 loss)
{p}1231 23:59:59.800000  1234 solver.cpp:239] Iteration 0 (0 iter/s, 0.3s/10 iters), loss = 2.4
{p}1231 23:59:59.800010  1234 solver.cpp:258]     Train net output #0: loss = 2.4 (* 1 = 2.4 loss)
{p}1231 23:59:59.800020  1234 sgd_solver.cpp:112] Iteration 0, lr = 0.01
{n}0101 00:00:01.000000  1234 solver.cpp:239] Iteration 10 (8.3 iter/s, 1.2s/10 iters), loss = 1.5
{n}0101 00:00:01.000010  1234 solver.cpp:258]     Train net output #0: loss = 1.5 (* 1 = 1.5 loss)
{n}0101 00:00:01.000020  1234 sgd_solver.cpp:112] Iteration 10, lr = 1e-3
{n}0101 00:00:01.100000  1234 solver.cpp:347] Iteration 20, Testing net (#0)
{n}0101 00:00:01.250000  1234 solver.cpp:414]     Test net output #0: accuracy = 0.75
{n}0101 00:00:01.250010  1234 solver.cpp:414]     Test net output #1: loss = nan
"""


@pytest.mark.parametrize("prefixes", [("I", "I"), ("I2025", "I2026")], ids=["old-glog", "glog-0.7"])
def test_train_and_test_rows_across_new_year(tmp_path, prefixes):
    log = tmp_path / "tiny.log"
    log.write_text(TINY_LOG.format(p=prefixes[0], n=prefixes[1]))
    train, test = parse_log(log)
    # Seconds from the "Solving" line at 23:59:59.5 to each row's first output, across midnight.
    assert train == [{"NumIters": 0.0, "Seconds": 0.30001, "LearningRate": 0.01, "loss": 2.4},
                     {"NumIters": 10.0, "Seconds": 1.50001, "LearningRate": 0.01, "loss": 1.5}]
    assert test[0] == {"NumIters": 0.0, "Seconds": 0.2, "LearningRate": 0.001, "accuracy": 0.125, "loss": 2.31}
    assert list(test[1].items())[:4] == [("NumIters", 20.0), ("Seconds", 1.75), ("LearningRate", 0.001),
                                         ("accuracy", 0.75)]
    assert len(test) == 2 and math.isnan(test[1]["loss"])


def test_the_command_writes_caffes_csv_files_and_a_png(tmp_path, capsys):
    log = tmp_path / "tiny.log"
    log.write_text(TINY_LOG.format(p="I2025", n="I2026"))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert cli.main(["parse_log", str(log), str(out_dir)]) == 0
    assert (out_dir / "tiny.log.train").read_text() == ("NumIters,Seconds,LearningRate,loss\n"
                                                         "0.0,0.30001,0.01,2.4\n10.0,1.50001,0.01,1.5\n")
    assert (out_dir / "tiny.log.test").read_text() == ("NumIters,Seconds,LearningRate,accuracy,loss\n"
                                                        "0.0,0.2,0.001,0.125,2.31\n20.0,1.75,0.001,0.75,nan\n")
    matplotlib_image = pytest.importorskip("matplotlib.image")
    png = tmp_path / "curves.png"
    assert cli.main(["parse_log", "-plot", str(png), str(log), str(out_dir)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert matplotlib_image.imread(png).shape == (450, 1200, 4)


def test_a_log_without_training_is_named(tmp_path, capsys):
    log = tmp_path / "test_only.log"
    log.write_text("I20261123 08:32:31.818061 17459 caffe.cpp:197] Use CPU.\n")
    assert cli.main(["parse_log", str(log), str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"parse_log: {log}: no 'Solving' line: not the log of a training run"
