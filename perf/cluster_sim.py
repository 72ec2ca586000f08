"""A cluster of GPU nodes on this machine: the compute modelled (scaffe.modelled), the hosts made of network
namespaces (jobs/cluster.sh), time dilated so that the CPU stays out of the way, over a grid of host counts,
ranks per host, link rates and schedules. One line per run:

    RESULT net=N gpu=G hosts=H per_host=R link=L schedule=S iter_ms=X compute_ms=C grad_bytes=B bound_ms=Y
           x_bound=Z efficiency=E cpu_busy=F dilation=D rss_mb=M total_mb=T

iter_ms is undilated (scaffe train's `Modelled:` line), compute_ms one rank's modelled iteration, efficiency
the weak-scaling efficiency against one GPU (compute_ms / iter_ms), rss_mb the largest rank's resident memory,
total_mb all ranks' proportional set size together (shared pages counted once: what the machine holds).
Each schedule's lower bound (B the gradients' bytes, T a link's bytes per second, C compute_ms, H hosts; the
ranks of a host meet in shared memory, which the bound leaves out):
- native: C + 2 (H-1)/H B / T. MPI's Allreduce follows the backward (no overlap), and no allreduce moves
  less than 2 (H-1)/H B through each host's link.
- allreduce: max(C, 2 (H-1)/H B / T): reduce-scatter and allgather between the hosts, overlapped.
- scaffe: max(C, k B / T), k = 0 for one host, 1 for two, (2H-3)/(H-1) for more: gradients travel to the root
  and parameters back, pipelined along chains of the hosts taken in turn, so a host sends B of gradients and
  forwards the parameters in every turn but the one it ends (collectives.algorithms.chain.turns).

Dilation D (--dilation, or `auto`): every modelled time is D times longer (SCAFFE_TIME_DILATION) and every
link is shaped to rate / D, so the run is the cluster's slowed down D times; results are divided by D.
`auto` runs each configuration twice for a few iterations (at D and 4 D), measures the CPU busy fraction
(all ranks' CPU seconds over cores x wall), fits busy = floor + work / D and picks D so that it would be
0.2 (at most --max-dilation), and at least so large that rate / D stays
within what the bed's links carry (--bed-rate); the configuration's first schedule picks D for all of them.
Waits nap (SCAFFE_WAIT=nap, collectives.waiting) unless the environment says otherwise; MPI's own blocking
Allreduce, the native schedule's, yields the core with a nanosleep (MPICH's MPIR_CVAR_ENABLE_HEAVY_YIELD=1)
instead of spinning, and the ranks' timer slack (perf/timer_slack.py) makes each such sleep D times YIELD_NS.

    python -m perf.cluster_sim --net googlenet --batch 32 --gpu h100 --hosts 1,2,4 --per-host 8 \
        --link 100gbit,25gbit --schedules scaffe,allreduce,native [--dilation auto] [--plot out.png]
    python -m perf.cluster_sim --results run1.txt run2.txt --plot out.png   # earlier runs' RESULT lines, drawn
    python -m perf.cluster_sim --net googlenet --gpu k80 --hosts 10 --per-host 16 --link 56gbit \
        --schedules scaffe --launcher mpirun_rsh   # the paper's run, launched as `mpirun_rsh -np 160 -hostfile F`

`--launcher mpirun_rsh` starts each run with jobs/mpirun_rsh.sh and mpirun_rsh's own arguments (-np N, -hostfile
F, the settings as VAR=VALUE) in place of the bed's `run`; both reach the hosts through hydra.

Needs root (jobs/cluster.sh). --profile LOG takes a `caffe time` log in place of --gpu's model.
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "jobs" / "cluster.sh"
BED = "csim"
YIELD_NS = 500  # the native schedule's MPI yields: how long each sleeps, undilated (perf/timer_slack.py)
STATE = Path("/run/scaffe-bed") / BED  # jobs/cluster.sh's files for the bed: its hosts, its launcher
BUSY_TARGET = 0.2
MODELLED = re.compile(r"Modelled: ([0-9.]+) ms per iteration .* one rank's compute ([0-9.]+) ms, gradients (\d+) "
                      r"bytes, cpu_busy ([0-9.]+), dilation ([0-9.e+]+), largest rank's memory ([0-9.]+) MB, "
                      r"all ranks' ([0-9.]+) MB")
RATE = re.compile(r"^([0-9.]+)([kmg]?)bit$")


def bits_per_second(rate):
    match = RATE.match(rate)
    if match is None:
        raise SystemExit(f"--link {rate}: give a rate like 100gbit, 25gbit or 2200mbit")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def bound_ms(schedule, compute_ms, grad_bytes, hosts, link_bytes_per_s):
    """The schedule's lower bound on an iteration (the module's docstring gives the formulas)."""
    allreduce_ms = 1000 * 2 * (hosts - 1) / hosts * grad_bytes / link_bytes_per_s
    if schedule == "native":
        return compute_ms + allreduce_ms
    if schedule == "allreduce":
        return max(compute_ms, allreduce_ms)
    carried = 0 if hosts == 1 else 1 if hosts == 2 else (2 * hosts - 3) / (hosts - 1)
    return max(compute_ms, 1000 * carried * grad_bytes / link_bytes_per_s)


def solver_file(net, batch, folder):
    """A solver prototxt for `net` at `batch` per GPU, written into `folder`."""
    from google.protobuf import text_format
    from perf import train_scaling
    param = getattr(train_scaling, f"{net}_solver_param")(batch)
    param.display = 0
    path = Path(folder) / f"{net}_b{batch}_solver.prototxt"
    path.write_text(text_format.MessageToString(param))
    return path


def cluster(*args, timeout=600):
    done = subprocess.run(["env", f"SCAFFE_BED={BED}", "bash", str(CLUSTER), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"cluster.sh {' '.join(map(str, args))} failed:\n{done.stdout}{done.stderr}")
    return done


def launch(launcher, hosts_file, per_host, settings, command):
    """The command line that starts `command` on `per_host` ranks of every bed host listed in `hosts_file`
    (jobs/cluster.sh's, "ADDRESS NAMESPACE" lines), `settings` given to every rank, and the environment
    it needs: the bed's own `run`, or jobs/mpirun_rsh.sh with mpirun_rsh's arguments (-np, -hostfile,
    VAR=VALUE), as the paper's users launch, its hydra sent through the bed's launcher."""
    env = dict(os.environ, SCAFFE_BED=BED)
    if launcher == "bed":
        env.update(settings)
        return ["bash", str(CLUSTER), "run", "-n", str(per_host), *command], env
    addresses = [line.split()[0] for line in Path(hosts_file).read_text().splitlines()]
    hostfile = Path(hosts_file).with_name("mpirun_rsh_hosts")
    hostfile.write_text("".join(f"{address}:{per_host}\n" for address in addresses))
    env.update(HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=str(Path(hosts_file).with_name("launch")),
               HYDRA_IFACE=f"{BED}br")
    return ["bash", str(ROOT / "jobs" / "mpirun_rsh.sh"), "-np", str(len(addresses) * per_host), "-hostfile",
            str(hostfile), *(f"{name}={value}" for name, value in settings.items()), *command], env


def modelled_run(solver, profile, hosts, per_host, rate_bits, schedule, dilation, iterations, scale,
                 launcher="bed"):
    """One run on a bed of `hosts` hosts whose links carry rate_bits / dilation: the `Modelled:` numbers."""
    shaped = max(1, int(rate_bits / dilation / 1000))
    cluster("up", hosts, "--rate", f"{shaped}kbit")
    try:
        settings = dict(SCAFFE_TIME_DILATION=str(dilation), SCAFFE_COMPUTE_SCALE=str(scale),
                        OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
                        # Waiting ranks leave the cores to the others and the TCP stack, napping up to 20 us
                        # undilated.
                        SCAFFE_WAIT=os.environ.get("SCAFFE_WAIT", f"nap:{0.02 * dilation:g}"),
                        # A wait of an iteration lasts D times longer too, past the stall inspector's default 60 s at
                        # the largest D (perf/RESULTS.md, "The plotted S-Caffe runs again"): it allows 0.25 s
                        # undilated, several iterations, or that default if longer.
                        SCAFFE_STALL_S=os.environ.get("SCAFFE_STALL_S", f"{max(60.0, 0.25 * dilation):g}"))
        train = [sys.executable, "-m", "scaffe", "train", f"--solver={solver}", f"--compute-profile={profile}",
                 f"--iterations={iterations}", f"--schedule={schedule}"]
        if schedule == "native":
            # MPICH's blocking Allreduce polls until it is done; told to nanosleep when it yields, it keeps its
            # iteration and leaves the bed's CPU about half as busy (perf/RESULTS.md, "The modelled bed with
            # the H200-fitted model"). Each nanosleep lasts about the timer slack: D times YIELD_NS, as short
            # undilated as ever, and the spin's CPU D times smaller ("MPICH's spin under a dilated timer slack").
            settings["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = os.environ.get("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
            train = [sys.executable, str(ROOT / "perf" / "timer_slack.py"), str(int(YIELD_NS * dilation)), *train]
        command, env = launch(launcher, STATE / "hosts", per_host, settings, train)
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600 * 3)
    finally:
        cluster("down")
    match = MODELLED.search(done.stdout + done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"run failed ({hosts} hosts x {per_host}, {schedule}, D={dilation}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    iter_ms, compute_ms, grad_bytes, busy, _, rss_mb, total_mb = (float(g) for g in match.groups())
    return iter_ms, compute_ms, int(grad_bytes), busy, rss_mb, total_mb


def pick_dilation(args, solver, hosts, per_host, rate_bits, schedule):
    """D for one configuration: from two short trials' CPU busy fractions, and the bed's link rate.

    The CPU's own work per iteration is fixed, so its busy fraction falls as 1/D, above what the waits cost
    while they last (a fraction of their own): busy(D) = floor + work / D, fitted to trials at D and 4 D."""
    low = args.trial_dilation
    busy = [modelled_run(solver, args.profile, hosts, per_host, rate_bits, schedule, d, args.trial_iterations,
                         args.scale, args.launcher)[3] for d in (low, 4 * low)]
    work = max(0.0, (busy[0] - busy[1]) / (1 / low - 1 / (4 * low)))
    floor = max(0.0, busy[1] - work / (4 * low))
    by_cpu = work / (BUSY_TARGET - floor) if floor < BUSY_TARGET else args.max_dilation
    by_link = rate_bits / bits_per_second(args.bed_rate) if hosts > 1 else 1.0
    return min(args.max_dilation, max(1.0, math.ceil(max(by_cpu, by_link))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="googlenet", choices=("lenet", "alexnet", "googlenet"))
    parser.add_argument("--batch", type=int, default=32, help="per GPU")
    parser.add_argument("--gpu", default="h100", help="k80, v100 or h100 (the compute model)")
    parser.add_argument("--profile", default="", help="a `caffe time` log in place of --gpu's model")
    parser.add_argument("--scale", type=float, default=1.0, help="SCAFFE_COMPUTE_SCALE: a factor on the compute")
    parser.add_argument("--hosts", default="1,2", help="comma-separated host counts")
    parser.add_argument("--per-host", default="8", help="comma-separated ranks (GPUs) per host")
    parser.add_argument("--link", default="100gbit", help="comma-separated link rates")
    parser.add_argument("--schedules", default="scaffe,allreduce,native")
    parser.add_argument("--dilation", default="auto", help="D, or auto")
    parser.add_argument("--iterations", type=int, default=12, help="per run (the first 2 are not timed)")
    parser.add_argument("--trial-iterations", type=int, default=5)
    parser.add_argument("--trial-dilation", type=float, default=10.0, help="auto: trials at D and 4 D")
    parser.add_argument("--max-dilation", type=float, default=400.0)
    parser.add_argument("--bed-rate", default="1500mbit", help="what a bed link carries well (perf/link_rate.py)")
    parser.add_argument("--launcher", default="bed", choices=("bed", "mpirun_rsh"),
                        help="jobs/cluster.sh run, or jobs/mpirun_rsh.sh -np N -hostfile F VAR=VALUE ... (hydra)")
    parser.add_argument("--plot", default="", help="draw efficiency and x_bound against GPUs here (the plot extra)")
    parser.add_argument("--results", nargs="*", default=[],
                        help="files of earlier runs' RESULT lines: draw those (--plot) instead of running")
    args = parser.parse_args(argv)
    args.profile = args.profile or args.gpu
    if args.results:
        rows = [row for path in args.results for row in read_results(path)]
        if args.plot:
            plot(rows, args.plot)
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        solver = solver_file(args.net, args.batch, folder)
        for link in args.link.split(","):
            rate_bits = bits_per_second(link)
            for hosts in map(int, args.hosts.split(",")):
                for per_host in map(int, args.per_host.split(",")):
                    schedules = args.schedules.split(",")
                    # One D for the configuration, from its first schedule: the schedules compare at the same D
                    # (native's MPI Allreduce spins in its waits, so its busy fraction does not fall with D).
                    dilation = (pick_dilation(args, solver, hosts, per_host, rate_bits, schedules[0])
                                if args.dilation == "auto" else float(args.dilation))
                    for schedule in schedules:
                        iter_ms, compute_ms, grad_bytes, busy, rss_mb, total_mb = modelled_run(
                            solver, args.profile, hosts, per_host, rate_bits, schedule, dilation, args.iterations,
                            args.scale, args.launcher)
                        bound = bound_ms(schedule, compute_ms, grad_bytes, hosts, rate_bits / 8)
                        row = dict(net=args.net, gpu=Path(args.profile).name, hosts=hosts, per_host=per_host,
                                   link=link, schedule=schedule, iter_ms=f"{iter_ms:.2f}",
                                   compute_ms=f"{compute_ms:.2f}", grad_bytes=grad_bytes, bound_ms=f"{bound:.2f}",
                                   x_bound=f"{iter_ms / bound:.3f}", efficiency=f"{compute_ms / iter_ms:.3f}",
                                   cpu_busy=f"{busy:.3f}", dilation=f"{dilation:g}", rss_mb=f"{rss_mb:.0f}",
                                   total_mb=f"{total_mb:.0f}")
                        rows.append(row)
                        print("RESULT " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.plot:
        plot(rows, args.plot)


def read_results(path):
    """The rows of the RESULT lines in file `path` (what a run printed)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.startswith("RESULT "):
            row = dict(field.split("=", 1) for field in line.split()[1:])
            row["hosts"], row["per_host"] = int(row["hosts"]), int(row["per_host"])
            rows.append(row)
    return rows


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (efficiency, x_bound) = plt.subplots(1, 2, figsize=(11, 4))
    for key in sorted({(row["schedule"], row["gpu"], row["link"]) for row in rows}):
        chosen = [row for row in rows if (row["schedule"], row["gpu"], row["link"]) == key]
        gpus = [row["hosts"] * row["per_host"] for row in chosen]
        efficiency.plot(gpus, [float(row["efficiency"]) for row in chosen], marker="o", label=" ".join(key))
        x_bound.plot(gpus, [float(row["x_bound"]) for row in chosen], marker="o", label=" ".join(key))
    for axes, title in ((efficiency, "weak-scaling efficiency"), (x_bound, "iteration / its bound")):
        axes.set_xlabel("GPUs")
        axes.set_title(title)
        axes.legend()
    figure.tight_layout()
    figure.savefig(path)


if __name__ == "__main__":
    main()
