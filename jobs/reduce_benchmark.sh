#!/usr/bin/env bash
# The side-by-side reduce benchmark (native MPI vs scaffe in one run) on one host.
# Usage: bash jobs/reduce_benchmark.sh [ranks] [osu flags...]   (default 4 ranks, 4 B .. 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
shift || true
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e .
.venv/bin/mpiexec -n "$ranks" .venv/bin/python -m perf.osu_reduce --impl both -m 4:67108864 "$@"
