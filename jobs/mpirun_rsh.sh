#!/usr/bin/env bash
# Launch as MVAPICH2's mpirun_rsh does, with its own arguments:
#
#   jobs/mpirun_rsh.sh -np N -hostfile F [VAR=VALUE ...] COMMAND [ARGS...]
#   e.g. jobs/mpirun_rsh.sh -np 160 -hostfile hosts SCAFFE_WAIT=nap scaffe train --solver=solver.prototxt
#
# MVAPICH2's mpirun_rsh runs it where it is installed; elsewhere MPICH's hydra mpiexec runs it with the
# same meaning (-f F -n N, each VAR=VALUE as -genv VAR VALUE). The hostfile's lines are "host" or "host:N"
# (N ranks on that host), which both read alike. MV2_USE_CUDA defaults to 0 (1 turns on MVAPICH2-GDR's
# CUDA-aware path). MPIEXEC names the mpiexec to use; hydra's HYDRA_* variables (launcher, interface) pass
# through, which is how tests run it on the bed of jobs/cluster.sh.
set -euo pipefail
usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

np="" hostfile=""
while (($#)); do
    case $1 in
        -np) np=${2:-}; shift 2 || usage ;;
        -hostfile) hostfile=${2:-}; shift 2 || usage ;;
        *) break ;;
    esac
done
[[ $np =~ ^[1-9][0-9]*$ ]] || { echo "mpirun_rsh.sh: give -np N (a number of ranks)" >&2; usage; }
[[ -n $hostfile && -f $hostfile ]] || { echo "mpirun_rsh.sh: give -hostfile F (an existing file)" >&2; usage; }
settings=()
while (($#)) && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    settings+=("$1")
    shift
done
(($#)) || { echo "mpirun_rsh.sh: give the command to run" >&2; usage; }
[[ " ${settings[*]:-} " == *" MV2_USE_CUDA="* ]] || settings+=("MV2_USE_CUDA=${MV2_USE_CUDA:-0}")

if [[ -z ${MPIEXEC:-} ]] && command -v mpirun_rsh >/dev/null; then
    exec mpirun_rsh -np "$np" -hostfile "$hostfile" "${settings[@]}" "$@"
fi
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mpiexec=${MPIEXEC:-}
if [[ -z $mpiexec ]]; then
    for candidate in "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/mpiexec}" "$repo/.venv/bin/mpiexec" "$(command -v mpiexec || true)"; do
        if [[ -n $candidate && -x $candidate ]]; then mpiexec=$candidate; break; fi
    done
fi
[[ -n $mpiexec ]] || { echo "mpirun_rsh.sh: neither mpirun_rsh nor mpiexec found (set MPIEXEC)" >&2; exit 1; }
genv=()
for setting in "${settings[@]}"; do genv+=(-genv "${setting%%=*}" "${setting#*=}"); done
exec "$mpiexec" -f "$hostfile" -n "$np" "${genv[@]}" "$@"
