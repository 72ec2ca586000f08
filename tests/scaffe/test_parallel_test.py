"""Testing on several ranks: `scaffe test` and the tests during `scaffe train` deal the test batches out
to the ranks and the root reports the numbers one process reports; the training log states the global
batch, ranks, hosts, the shard rule and the epoch length."""
import csv
import re

import pytest

from scaffe.solvers import solver_from_file
from training_job import Job, write_tiny_solver

GLOG_PREFIX = re.compile(r"^[IWEF]\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")


def report(log, pattern):
    """The message part of the log lines matching `pattern`."""
    lines = [GLOG_PREFIX.sub("", line) for line in log.splitlines()]
    return [line for line in lines if re.search(pattern, line)]


def run(ranks, args, env=None):
    with Job(ranks, args, env) as job:
        assert job.finish(300) == 0, job.log[-3000:]
    return job.log


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Weights of the tiny net after a short single-process training, and its net file."""
    folder = tmp_path_factory.mktemp("trained")
    solver = solver_from_file(write_tiny_solver(folder, max_iter=30))
    solver.solve()
    solver.close()
    return folder / "tiny_iter_30.caffemodel", folder / "tiny_16.prototxt"


def test_scaffe_test_on_two_ranks_reports_what_one_rank_reports(trained):
    weights, model = trained
    args = ["test", f"--model={model}", f"--weights={weights}", "--iterations=5"]  # 3 batches on rank 0, 2 on 1
    pattern = r"^(Batch \d+, |Loss: |accuracy = |loss = )"
    single, sharded = report(run(1, args), pattern), report(run(2, args), pattern)
    assert len(single) == 5 * 2 + 3, single
    assert sharded == single


def train_and_read_tests(folder, ranks, batch, schedule="scaffe"):
    """Trains the tiny net 20 iterations, testing every 10; the log and the (iteration, accuracy, loss) of each test."""
    folder.mkdir()
    solver = write_tiny_solver(folder, batch=batch, max_iter=20, display=10, extra="test_iter: 5\ntest_interval: 10")
    # The scaffe schedule holds every piece back until after backward (a budget of 1 byte): each test must
    # first see the last iteration's updates land.
    log = run(ranks, ["train", f"--solver={solver}", f"--schedule={schedule}", f"--log_csv={folder}/log.csv"],
              env={"SCAFFE_BACKWARD_BYTES": "1"})
    with open(folder / "log.csv", newline="") as f:
        scores = [(int(row["iteration"]), float(row["test0_accuracy"]), float(row["test0_loss"]))
                  for row in csv.DictReader(f) if row["test0_accuracy"]]
    assert len(report(log, r"Testing net")) == len(scores) == 3, log[-3000:]
    return log, scores


@pytest.fixture(scope="module")
def one_rank_tests(tmp_path_factory):
    return train_and_read_tests(tmp_path_factory.mktemp("one_rank") / "run", 1, 32)[1]


@pytest.mark.parametrize("schedule", ["scaffe", "allreduce"])
def test_training_tests_on_every_rank_with_the_numbers_of_one_rank(tmp_path, schedule, one_rank_tests):
    """2 ranks x batch 16 against 1 rank x batch 32: the same test scores at every test; the first
    test (iteration 0, same weights) exactly. The S-Caffe schedule's non-root ranks skip updates, so
    this also checks they test with the root's parameters."""
    log, scores = train_and_read_tests(tmp_path / "run", 2, 16, schedule)
    assert [s[0] for s in scores] == [0, 10, 20]
    assert scores[0] == one_rank_tests[0]
    for (_, acc2, loss2), (_, acc1, loss1) in zip(scores, one_rank_tests):
        assert acc2 == pytest.approx(acc1, abs=1e-9) and loss2 == pytest.approx(loss1, rel=1e-5)
    assert report(log, r"^Global batch 32 = 16 per rank x 2 ranks x iter_size 1; 2 rank\(s\) on 1 host\(s\)$")
    assert report(log, r"^Training data sharded round-robin: rank r of 2 reads records r, r\+2, r\+4, ")
    assert report(log, r"^Epoch: 4000 records = 125 iterations of the global batch$")
    assert report(log, r"^Testing sharded by batch: rank r of 2 runs test batches r, r\+2, ")
