#!/usr/bin/env bash
# Single host, from a fresh clone: make the virtual environment (once), then run the main job.
# Usage: bash jobs/quickstart.sh [ranks]   (default 4)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e .
# The side-by-side reduce benchmark: native MPI vs scaffe in the same run, with their ratio.
.venv/bin/mpiexec -n "$ranks" .venv/bin/python -m perf.osu_reduce --impl both -m 4:67108864 -c
