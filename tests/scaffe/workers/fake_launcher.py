"""A stand-in for hydra's mpiexec (`[-hosts h:s,...] -n P PROGRAM...`) that `scaffe elastic` drives in tests.

It runs nothing real: it records every call, plays the training jobs a plan scripts, and keeps each host's
memory (its commits and GROW flag) in a folder of its own. FAKE_LAUNCHER_STATE names the state folder:
  plan.json    {"jobs": [JOB, ...]}, one JOB per training launch, in order:
               {"exit": 1, "commits": {"h1": [20, 40]}, "silent": ["h2"], "hangs": ["h3"], "killed": "h2",
                "stalled": 1, "discover": "h1:1\\nh3:1\\n", "until_grow": true, "global_batch": 24}
               commits: written on those hosts (commit.json's global_batch: "global_batch", default 24);
               silent/hangs: hosts that from then on fail/hang when asked;
               killed: print hydra's report of a rank of that host killed by SIGKILL; stalled: print the stall
               inspector's report of that rank lost, on stderr, and its host hangs from then on; lingers:
               seconds to wait before exiting (a launcher waiting on a lost host); discover: the new text
               of discovery.txt when the job starts; until_grow: wait for GROW on the job's first host, then
               write the commits and end.
  calls.jsonl  one {"hosts": "h1:1,...", "ranks": P, "program": [...]} per call
  hosts/NAME/  the host's memory: iter_<N> folders and GROW
"""
import json
import os
import shutil
import sys
import time
from pathlib import Path

STATE = Path(os.environ["FAKE_LAUNCHER_STATE"])


def placement(argv):
    """(host names, ranks, program) of a hydra command line."""
    hosts = ["localhost"]
    if argv[0] == "-hosts":
        hosts = [item.split(":")[0] for item in argv[1].split(",")]
        argv = argv[2:]
    assert argv[0] == "-n", argv
    return hosts, int(argv[1]), argv[2:]


def memory(host):
    folder = STATE / "hosts" / host
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def lost(host):
    """'silent' or 'hangs' for a host that no longer answers, else ''."""
    for kind in ("silent", "hangs"):
        if (STATE / f"{kind}_{host}").exists():
            return kind
    return ""


def list_commits(host, commit_dir):
    if lost(host) == "hangs":
        time.sleep(60)
    if lost(host):
        sys.exit(255)
    for folder in sorted(memory(host).glob("iter_*"), reverse=True):
        print(int(folder.name[len("iter_"):]), f"{commit_dir}/{folder.name}")


def train(hosts, program):
    launches = STATE / "launches"
    number = int(launches.read_text()) if launches.exists() else 0
    launches.write_text(str(number + 1))
    job = json.loads((STATE / "plan.json").read_text())["jobs"][number]
    if "discover" in job:
        (STATE / "discovery.txt").write_text(job["discover"])
    if job.get("until_grow"):
        deadline = time.monotonic() + 30
        while not (memory(hosts[0]) / "GROW").exists():
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.02)
    for host, iterations in job.get("commits", {}).items():
        for iteration in iterations:
            commit = memory(host) / f"iter_{iteration:09d}"
            commit.mkdir(exist_ok=True)
            (commit / "commit.json").write_text(json.dumps({"iter": iteration, "ranks": len(hosts),
                                                            "global_batch": job.get("global_batch", 24)}))
    for kind in ("silent", "hangs"):
        for host in job.get(kind, []):
            (STATE / f"{kind}_{host}").touch()
    report_losses(job, hosts)
    time.sleep(job.get("lingers", 0))
    sys.exit(job["exit"])


def report_losses(job, hosts):
    """The stall inspector's report of a lost rank (on stderr) and hydra's of a killed one, as the job says."""
    if "stalled" in job:  # and its host hangs from then on
        (STATE / f"hangs_{hosts[job['stalled']]}").touch()
        sys.stderr.write(f"scaffe: rank 0: Allreduce #9 (4 B) has waited 5 s and a rank of it has not answered for "
                         f"SCAFFE_LOST_S=4 s; no answer (frozen, dead or exited): rank {job['stalled']}. "
                         f"Aborting the job.\n")
    if "killed" in job:
        print("=" * 83)
        print("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES")
        print(f"=   PID 4242 RUNNING AT {job['killed']}")
        print("=   EXIT CODE: 9")
        print("=" * 83, flush=True)


def on_each_host(hosts, program):
    """The supervisor's own small programs: scaffe.elastic.spread's copy from the first host to the others, the
    GROW flag's `sh -c "mkdir ... GROW"` and `rm -f .../GROW`."""
    for host in hosts:
        if lost(host):
            sys.exit(255)
        if "scaffe.elastic.spread" in program:
            source = memory(hosts[0]) / Path(program[-1]).name
            if not (memory(host) / source.name).exists():
                shutil.copytree(source, memory(host) / source.name)
        elif program[0] == "sh":
            (memory(host) / "GROW").touch()
        else:
            (memory(host) / "GROW").unlink(missing_ok=True)


def main():
    hosts, ranks, program = placement(sys.argv[1:])
    with open(STATE / "calls.jsonl", "a", encoding="utf-8") as calls:
        calls.write(json.dumps({"hosts": sys.argv[2] if sys.argv[1] == "-hosts" else "", "ranks": ranks,
                                "program": program}) + "\n")
    if "train" in program:
        train(hosts, program)
    elif "commits" in program:
        list_commits(hosts[0], program[program.index("--dir") + 1])
    elif program[0] == "cat":
        print((memory(hosts[0]) / Path(program[1]).relative_to(Path(program[1]).parents[1])).read_text())
    elif "commit-to-snapshot" not in program:
        on_each_host(hosts, program)


if __name__ == "__main__":
    main()
