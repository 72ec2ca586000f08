"""The elastic training settings: how often to commit (SCAFFE_COMMIT_ITERS) and where (SCAFFE_COMMIT_DIR).

variable             default                               meaning
SCAFFE_COMMIT_ITERS  0 (no commits)                        commit every N iterations, or with `auto` every
                                                           DEFAULT_COMMIT_ITERS or more as measured
                                                           (scaffe.elastic.committer; commit_iters); the
                                                           supervisor sets `auto` when the user chose none
SCAFFE_COMMIT_DIR    /dev/shm/scaffe-commits/<job>         where this host keeps its commits (commit_dir)
SCAFFE_JOB_ID        a name derived from the solver path   the <job> of the default directory (job_name)
(and the supervisor sets collectives' SCAFFE_LOST_S to DEFAULT_LOST_S when the user chose none)
"""
import hashlib
import os

from collectives import settings

# Measured for LeNet on 2 ranks (perf/RESULTS.md, "Committing the training state"): a commit costs the training
# thread 14-17 ms, 0.3% of the iteration at every 20 (0.7% at every 10), well under the 5% target; 20 also
# bounds the work lost to 20 iterations, the issue's own setting.
DEFAULT_COMMIT_ITERS = 20
AUTO = "auto"  # SCAFFE_COMMIT_ITERS: DEFAULT_COMMIT_ITERS or more, as measured
# The SCAFFE_LOST_S (collectives.settings) the supervisor gives its jobs: a rank that has not answered its
# peers' stall inspectors for 3 s is lost, so a host behind a link that went down ends the job in about 4 s and
# the job resumes within the 10 s (4 s did not leave enough: perf/RESULTS.md, "Cheaper commits"); live
# ranks answer within a poll (0.75 s) even while they compute.
DEFAULT_LOST_S = 3
COMMITS_ROOT = "/dev/shm/scaffe-commits"  # shared memory: outlives the ranks, not the host


def commit_iters():
    """SCAFFE_COMMIT_ITERS as (iterations between commits, whether more are measured): (N, False) for N, (0,
    False) when unset or 0 (no commits), (DEFAULT_COMMIT_ITERS, True) for `auto`."""
    value = os.environ.get("SCAFFE_COMMIT_ITERS", "").strip()
    if value.lower() == AUTO:
        return DEFAULT_COMMIT_ITERS, True
    return (settings.positive_int("SCAFFE_COMMIT_ITERS") if value not in ("", "0") else 0), False


def job_name(solver_path):
    """SCAFFE_JOB_ID, else the solver file's stem and a hash of its absolute path (two jobs training the same
    solver file from one folder share it; set SCAFFE_JOB_ID to tell them apart)."""
    job = os.environ.get("SCAFFE_JOB_ID", "").strip()
    if job:
        if "/" in job or job in (".", ".."):
            raise ValueError(f"SCAFFE_JOB_ID={job!r} must be a plain name, not a path")
        return job
    if not solver_path:
        raise ValueError("no commit directory: give --dir, or set SCAFFE_COMMIT_DIR or SCAFFE_JOB_ID")
    absolute = os.path.abspath(solver_path)
    stem = os.path.splitext(os.path.basename(absolute))[0]
    return f"{stem}-{hashlib.sha1(absolute.encode()).hexdigest()[:8]}"


def commit_dir(solver_path=None):
    """SCAFFE_COMMIT_DIR, else COMMITS_ROOT/<job> (job_name)."""
    chosen = os.environ.get("SCAFFE_COMMIT_DIR", "").strip()
    return chosen or os.path.join(COMMITS_ROOT, job_name(solver_path))
