#!/usr/bin/env bash
# MVAPICH2(-GDR) clusters: launch with mpirun_rsh over a hostfile (see jobs/hosts.example).
# Usage: NP=8 HOSTFILE=jobs/hosts.example bash jobs/mpirun_rsh.sh -m 4:67108864
# mpi4py must be built against the same MVAPICH2 (pip install --no-binary mpi4py mpi4py), see README.
set -euo pipefail
np=${NP:-8}
hostfile=${HOSTFILE:-jobs/hosts.example}
# MV2_USE_CUDA=1 turns on MVAPICH2-GDR's CUDA-aware path; harmless for host buffers.
exec mpirun_rsh -np "$np" -hostfile "$hostfile" MV2_USE_CUDA=${MV2_USE_CUDA:-0} \
    python -m perf.osu_reduce --impl both "$@"
