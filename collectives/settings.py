"""Every SCAFFE_* environment variable the collectives read: its type, default and meaning, and the one
function here that reads it. Each is read when asked (when a Comm is made or set up, never per call); a
value of the wrong form is a ValueError naming the variable.

variable                type                default               meaning (function)
SCAFFE_REDUCE_ALGO      native, tree,       the table in          one algorithm for every message size (reduce_algo)
                        chain or            collectives.
                        hierarchical        algorithms
SCAFFE_CHOICE           measured or table   measured              where the table picks a host algorithm (below 8x
                                                                  its threshold: planning.TRIAL_SPAN), time it
                                                                  against native MPI on the first calls of each
                                                                  size and keep the faster (measured), or keep
                                                                  the table's pick, which makes results bitwise
                                                                  reproducible from run to run (choice)
SCAFFE_CHUNK_BYTES      positive int        1 MiB                 the pipelines' chunk between ranks; the node
                                                                  heads' is an eighth of the call, at least 256
                                                                  KiB, at most this (chunk_bytes; heads_shape)
SCAFFE_SHM_CHUNK_BYTES  positive int        256 KiB / local       the part of the vector that one step of a node
                                            ranks (compiled       loop moves through a shared-memory cell; the
                                            loop), 1 MiB / local  cells hold the larger chunk (shm_chunk_bytes)
                                            ranks (interpreted
                                            loop, broadcast); at
                                            least 64 KiB
SCAFFE_RANKS_PER_NODE   positive int        unset: the real       cut each host into simulated nodes of this many
                                            nodes                 ranks (ranks_per_node)
SCAFFE_CHECK            0 or 1 (not 0       0                     check that the ranks agree on counts, dtypes, ops
                        counts as 1)                              and roots (check)
SCAFFE_WAIT             spin, nap or        spin                  how a wait for MPI requests waits: MPI's own
                        nap:MS                                    wait, which spins, or Tests that yield the
                                                                  core and nap, up to MS ms (1) a nap
                                                                  (wait_policy; collectives.waiting)
SCAFFE_STALL_S          seconds >= 0        60                    abort with a report when a collective has waited
                                                                  this long; 0: off (stall_seconds)
SCAFFE_LOST_S           seconds >= 0        0                     once a collective has waited this long, a rank
                                                                  of it that leaves the stall inspector's question
                                                                  unanswered as long again is lost: the job ends
                                                                  at once, with the report; 0: off, only the
                                                                  stall limit ends it; `scaffe elastic` sets 3
                                                                  (lost_seconds)
SCAFFE_GPU              a GPU id            local rank % GPUs     the GPU of every rank of the node (gpu)
SCAFFE_CUDA_AWARE       0 or 1              unset: detected       whether the MPI library takes device buffers, in
                                            (algorithms.          place of the detection; 1: the leaders' device
                                            device_pipeline)      pipeline hands MPI device chunks, 0: pinned host
                                                                  copies of them (cuda_aware_override)
SCAFFE_ABORT_ON_ERROR   0 or 1              1                     whether making a Comm installs the abort hook
                                                                  (abort_on_error)
SCAFFE_DEVICE_PATH      direct or staged    direct                device buffers: reduced in place on the devices
                                                                  (IPC inside a node), or copied whole to pinned
                                                                  host memory and back around the host path
                                                                  (device_path)

scaffe's logging settings (glog's GLOG_minloglevel, GLOG_logtostderr, GLOG_log_dir) are read by scaffe.log,
SCAFFE_PIECE_BYTES and SCAFFE_MESSAGE_BYTES by scaffe.parallel.pieces, SCAFFE_BACKWARD_BYTES by
scaffe.parallel.deferral, SCAFFE_CAPTURE by scaffe.capture, SCAFFE_LMDB_PARTIAL by scaffe.data.lmdb_reader
(through `switch`), SCAFFE_COMMIT_ITERS, SCAFFE_COMMIT_DIR and SCAFFE_JOB_ID by scaffe.elastic.settings;
MVAPICH2-GDR's MV2_USE_CUDA is read here too (mvapich_cuda), as a sign of a CUDA-aware MPI library.
"""
import math
import os


def reduce_algo(known):
    """SCAFFE_REDUCE_ALGO, lower-cased: the algorithm for every size, one of `known`; None when unset."""
    name = os.environ.get("SCAFFE_REDUCE_ALGO", "").strip().lower()
    if name and name not in known:
        raise ValueError(f"SCAFFE_REDUCE_ALGO={name!r} is not one of {', '.join(sorted(known))}")
    return name or None


def choice():
    """SCAFFE_CHOICE: "measured" (the default) or "table"."""
    return _read("SCAFFE_CHOICE", "measured", str.lower, lambda v: v in ("measured", "table"), "measured or table")


def chunk_bytes():
    """SCAFFE_CHUNK_BYTES: the largest chunk of the inter-node pipelines."""
    return positive_int("SCAFFE_CHUNK_BYTES", 1 << 20)


def shm_chunk_bytes(local_ranks, compiled):
    """SCAFFE_SHM_CHUNK_BYTES: the chunk a step of the node loop (the `compiled` one or the interpreted one)
    moves through a shared-memory cell, on a node of `local_ranks` ranks."""
    # A group of chunks (one per local rank) of about 256 KiB keeps the compiled loop's cells in cache
    # (perf/RESULTS.md); the interpreted loop's groups of about 1 MiB are large enough that the Python
    # around each step vanishes, small enough that the rings stay in cache (perf/osu_allreduce.py).
    group_bytes = 256 << 10 if compiled else 1 << 20
    return positive_int("SCAFFE_SHM_CHUNK_BYTES", max(64 << 10, group_bytes // local_ranks))


def ranks_per_node():
    """SCAFFE_RANKS_PER_NODE: the size of the simulated nodes; None for the real ones."""
    return positive_int("SCAFFE_RANKS_PER_NODE")


def check():
    """SCAFFE_CHECK: whether every collective first checks that the ranks agree on its arguments."""
    return os.environ.get("SCAFFE_CHECK", "0").strip() not in ("", "0")


def wait_policy():
    """SCAFFE_WAIT: how a rank waits for MPI requests: ("spin", None) (MPI's own wait), or ("nap", the longest
    nap in seconds) for `nap` (1 ms) or `nap:MS` (collectives.waiting)."""
    text = os.environ.get("SCAFFE_WAIT", "").strip().lower() or "spin"
    policy, _, longest = text.partition(":")
    try:
        nap_s = float(longest) / 1000 if longest else 1e-3
    except ValueError:
        nap_s = -1.0
    if policy == "spin" and not longest:
        return "spin", None
    if policy != "nap" or not nap_s > 0:
        raise ValueError(f"SCAFFE_WAIT={text!r} is not spin, nap or nap:MS (the longest nap in milliseconds)")
    return "nap", nap_s


def stall_seconds():
    """SCAFFE_STALL_S: how long a collective may wait before the stall inspector ends the job (0: never)."""
    return non_negative_seconds("SCAFFE_STALL_S", 60.0)


def lost_seconds():
    """SCAFFE_LOST_S: how long a rank a collective waits for may leave the stall inspector unanswered (0: off)."""
    return non_negative_seconds("SCAFFE_LOST_S", 0.0)


def gpu(count):
    """SCAFFE_GPU, checked against the node's `count` GPUs; None when unset."""
    chosen = os.environ.get("SCAFFE_GPU", "").strip()
    if not chosen:
        return None
    if not chosen.isdigit() or int(chosen) >= count:
        raise ValueError(f"SCAFFE_GPU={chosen!r}: this node has GPUs 0..{count - 1}")
    return int(chosen)


def gpu_for(local_rank, device_ids, count):
    """The GPU the process of `local_rank` drives, of `device_ids` (those it may use, of the node's `count`):
    SCAFFE_GPU when set (every rank of the node on that GPU), else the ranks take them in turn."""
    chosen = gpu(count)
    if chosen is None:
        return device_ids[local_rank % len(device_ids)]
    if chosen not in device_ids:
        raise ValueError(f"SCAFFE_GPU={chosen} is not among the GPUs this process may use ({list(device_ids)})")
    return chosen


def cuda_aware_override():
    """SCAFFE_CUDA_AWARE: True or False when it says whether the MPI library is CUDA-aware, None when unset."""
    return switch("SCAFFE_CUDA_AWARE", None)


def mvapich_cuda():
    """MVAPICH2-GDR's own MV2_USE_CUDA=1: the library was told to take device buffers."""
    return os.environ.get("MV2_USE_CUDA") == "1"


def abort_on_error():
    """SCAFFE_ABORT_ON_ERROR: whether making a Comm installs the abort hook (`collectives.install_abort_hook`)."""
    return switch("SCAFFE_ABORT_ON_ERROR", True)


def device_path():
    """SCAFFE_DEVICE_PATH, lower-cased: "direct" or "staged"."""
    return checked_device_path(os.environ.get("SCAFFE_DEVICE_PATH", "").strip().lower() or "direct",
                               "SCAFFE_DEVICE_PATH")


def checked_device_path(path, what="device_path"):
    """`path` if it names a device path ("direct" or "staged"), else a ValueError naming `what`."""
    if path not in ("direct", "staged"):
        raise ValueError(f"{what} must be direct or staged, got {path!r}")
    return path


def positive_int(name, default=None):
    """The value of environment variable `name` as a positive int, `default` when unset or empty."""
    return _read(name, default, int, lambda n: n >= 1, "a positive integer")


def non_negative_seconds(name, default):
    """The value of environment variable `name` as a finite number of seconds >= 0, `default` when unset or empty."""
    return _read(name, default, float, lambda s: s >= 0 and math.isfinite(s),
                 "a non-negative number of seconds (0 turns it off)")


def positive_number(name, default):
    """The value of environment variable `name` as a float > 0, `default` when unset or empty."""
    return _read(name, default, float, lambda v: v > 0 and math.isfinite(v), "a positive number")


def switch(name, default):
    """The value of environment variable `name` as a bool ("0" or "1"), `default` when unset or empty."""
    return _read(name, default, {"0": False, "1": True}.get, lambda _: True, "0 or 1")


def _read(name, default, parse, valid, wanted):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        parsed = parse(value)
    except ValueError:
        parsed = None
    if parsed is None or not valid(parsed):
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return parsed
