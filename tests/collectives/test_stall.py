"""No hang, ever: a frozen rank ends the job within SCAFFE_STALL_S + 30 s with a report naming it, a killed
one within 30 s, and a rank that is only slow does not end it (workers/stall.py); and what the stall
inspector learns from, collectives.events, hears of every collective (workers/events.py)."""
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from collectives import stall_report
from collectives.settings import non_negative_seconds
from mpi_harness import launch, require_ok, run_ok

STALL_S = 3  # above the first large call's set-up on a loaded 2-core machine, so only the frozen rank trips it
REPORT = re.compile(r"^scaffe: rank (\d+): (\w+ #\d+) \(([^)]*)\) has waited \d+ s \(SCAFFE_STALL_S=3\); (.*)$",
                    re.MULTILINE)

# place -> (SCAFFE_RANKS_PER_NODE, the operations a waiting rank may report stuck; see workers/stall.py)
FROZEN = {
    "small": (None, {"Allreduce #7"}),
    "large": (2, {"Allreduce #8"}),
    # The root of the Ireduce waits for the frozen rank; the others may finish both and go on.
    "nonblocking": (None, {"Ireduce #4", "Ibcast #4", "Allreduce #9"}),
}


def test_every_collective_is_reported_to_events():
    run_ok(2, "events.py", timeout=60)


# The jobs that a frozen or dead rank must end, and two of ranks that are slow but answer and one that leaves
# requests unwaited, which must end well: name -> (ranks, stall.py's action and place, settings).
JOBS = {**{place: (3, "stop", place, {"SCAFFE_STALL_S": STALL_S, "SCAFFE_RANKS_PER_NODE": per_node})
           for place, (per_node, _) in FROZEN.items()},
        "lost": (3, "stop", "small", {"SCAFFE_STALL_S": 60, "SCAFFE_LOST_S": 2}),
        "killed": (4, "kill", "large", {"SCAFFE_STALL_S": 60}),
        "answers late": (3, "5", "large", {"SCAFFE_STALL_S": 60, "SCAFFE_LOST_S": 2}),
        "unwaited": (3, str(STALL_S + 2), "unwaited", {"SCAFFE_STALL_S": STALL_S}),
        "inspector off": (3, "1", "small", {"SCAFFE_STALL_S": 0})}  # a limit of 0 s would trip at once


@pytest.fixture(scope="module")
def jobs():
    """Every job of JOBS, side by side: each spends most of its time waiting for a limit or a slow rank."""
    with ThreadPoolExecutor(len(JOBS)) as pool:
        started = {name: pool.submit(launch, ranks, "stall.py", action, place, timeout=60, env=env)
                   for name, (ranks, action, place, env) in JOBS.items()}
        return {name: job.result() for name, job in started.items()}


@pytest.mark.parametrize("place", FROZEN)
def test_frozen_rank_ends_the_job_with_a_report(jobs, place):
    stuck = FROZEN[place][1]
    job = jobs[place]
    assert not job.timed_out and job.returncode != 0, job.report()
    assert job.seconds < STALL_S + 30, job.report()
    reports = REPORT.findall(job.stderr)
    assert reports, "no stall report\n" + job.report()
    for rank, operation, _, rest in reports:
        assert rank in ("0", "1") and operation in stuck, job.report()
        assert re.search(r"no answer \(frozen, dead or exited\): rank 2[;.]", rest), job.report()


LOST_REPORT = re.compile(r"^scaffe: rank [01]: \w+ #\d+ \([^)]*\) has waited \d+ s and a rank of it has not answered "
                         r"for SCAFFE_LOST_S=2 s; (.*)$", re.MULTILINE)


def test_a_rank_that_stops_answering_ends_the_job_long_before_the_stall_limit(jobs):
    job = jobs["lost"]
    assert not job.timed_out and job.returncode != 0 and job.seconds < 25, job.report()
    reports = LOST_REPORT.findall(job.stderr)
    assert reports and all("no answer (frozen, dead or exited): rank 2" in rest for rest in reports), job.report()
    assert stall_report.silent_ranks(job.stderr) == {2}


def test_a_rank_slower_than_the_lost_limit_that_answers_is_waited_for(jobs):
    job = require_ok(jobs["answers late"])
    assert "stall inspector running: True" in job.stdout, job.report()


def test_killed_rank_ends_the_job(jobs):
    job = jobs["killed"]
    assert not job.timed_out and job.returncode != 0, job.report()
    assert job.seconds < 30, job.report()


def test_slow_rank_within_the_limit_does_not_abort():
    job = run_ok(3, "stall.py", "1", "nonblocking", timeout=60, env={"SCAFFE_STALL_S": STALL_S})
    assert "stall inspector running: True" in job.stdout, job.report()


def test_small_requests_left_unwaited_past_the_limit_do_not_abort(jobs):
    """A small Ireduce and Ibcast are MPI's own requests, complete long before the program waits for them, 2 s
    past the stall limit: the inspector asks MPI whether they completed before it would abort."""
    job = require_ok(jobs["unwaited"])
    assert "stall inspector running: True" in job.stdout, job.report()


def test_zero_turns_the_inspector_off(jobs):
    job = require_ok(jobs["inspector off"])
    assert "stall inspector running: False" in job.stdout, job.report()


def test_bad_setting_is_a_one_line_error():
    job = launch(1, "stall.py", "0", "small", timeout=60, env={"SCAFFE_STALL_S": "soon"})
    assert not job.timed_out and job.returncode != 0, job.report()
    assert ("ValueError: SCAFFE_STALL_S must be a non-negative number of seconds (0 turns it off), got 'soon'\n"
            in job.stderr), job.report()


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e999", "ten"])
def test_non_negative_seconds_rejects(value, monkeypatch):
    monkeypatch.setenv("SCAFFE_STALL_S", value)
    with pytest.raises(ValueError, match=f"SCAFFE_STALL_S must be a non-negative number of seconds .*got '{value}'"):
        non_negative_seconds("SCAFFE_STALL_S", 60)


@pytest.mark.parametrize("value,expected", [("", 60), (" 0 ", 0), ("2.5", 2.5)])
def test_non_negative_seconds_reads(value, expected, monkeypatch):
    monkeypatch.setenv("SCAFFE_STALL_S", value)
    assert non_negative_seconds("SCAFFE_STALL_S", 60) == expected


def test_report_names_each_rank_by_what_it_does():
    states = {
        1: {"started": {(0, "Allreduce"): 12}, "in_flight": [(0, "Allreduce", 12, 20.4)]},
        2: {"started": {(0, "Allreduce"): 11, (0, "Bcast"): 5}, "in_flight": [(0, "Bcast", 5, 19.6)]},
        4: {"started": {(0, "Allreduce"): 11}, "in_flight": []},
        5: {"started": {}, "in_flight": [(1, "Ireduce", 3, 2.0)]},
    }
    text = stall_report.report(0, (0, "Allreduce", 12, 4 << 20, 20.7), [1, 2, 3, 4, 5], states, 20)
    assert text == (
        "scaffe: rank 0: Allreduce #12 (4.0 MiB) has waited 21 s (SCAFFE_STALL_S=20); "
        "not joined: rank 2 (at Bcast #5 for 20 s), rank 4 (in no collective, computing: after Allreduce #11), "
        "rank 5 (at Ireduce #3 on communicator 1 for 2 s); "
        "no answer (frozen, dead or exited): rank 3; joined: rank 1. Aborting the job.\n")
    assert stall_report.silent_ranks(text) == {3}
    assert stall_report.silent_ranks("rank 3 (in no collective, computing)") == set()
