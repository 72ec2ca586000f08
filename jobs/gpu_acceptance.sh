#!/usr/bin/env bash
# Issue 18's GPU acceptance in one command, about 10 minutes on one GPU (an H100 or H200):
#   1. installs what the machine lacks (mpich, mpi4py, lmdb, protobuf) from wheels carried along
#      (made here by jobs/fetch_gpu_wheels.sh), beside the image's own packages;
#   2. the compile check and the `gpu`-marked tests;
#   3. the device bounds: one fused kernel summing four 64 MiB buffers, device-to-device copy rates;
#   4. OSU Reduce, Allreduce, Bcast with 4 ranks sharing the GPU, numba (-d cuda) and cupy (-d cupy)
#      buffers, staged and scaffe side by side (--impl both), 4 B to 256 MiB;
#   5. LeNet trained on the GPU with 1 rank, and 2 and 4 ranks sharing it under both schedules;
#   6. ms/iter of LeNet b64, cifar10_quick b100 and AlexNet b128, scaffe and PyTorch eager (if installed);
#   7. the verdict table against the acceptance lines (exit status 1 unless every line passes).
# Every step logs to LOGS/<step>.log; a failed or timed-out step is reported and the rest still run.
# The steps share one time budget (default 570 s), so the verdict is printed inside a 10-minute limit:
# a step gets what is left of it, one that would get under 15 s is skipped (its verdict lines: MISSING).
# OSU Bcast, which no acceptance line reads, runs last.
#
# Usage: bash jobs/gpu_acceptance.sh [--dry-run] [--wheels DIR] [--logs DIR] [--budget SECONDS]
#                                    [--lenet-iterations N]
#   --dry-run  print the plan (every command) and run nothing; needs no GPU
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

dry_run=0
wheels=.whl
logs=/tmp/scaffe_gpu_acceptance
lenet_iterations=2000
budget=570
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --wheels) wheels=$2; shift ;;
        --logs) logs=$2; shift ;;
        --budget) budget=$2; shift ;;
        --lenet-iterations) lenet_iterations=$2; shift ;;
        *) echo "gpu_acceptance.sh: unknown argument $1 (see the usage at the top of the script)" >&2; exit 2 ;;
    esac
    shift
done

PY=python3
MPIEXEC=mpiexec
PREFIX=/tmp/scaffe-gpu-prefix
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=()
deadline=$((SECONDS + budget))

# step NAME SECONDS COMMAND...: runs COMMAND with a time limit, output to LOGS/NAME.log
step() {
    local name=$1 seconds=$2
    shift 2
    echo "+ [$name, at most ${seconds}s] $*"
    [ "$dry_run" = 1 ] && return 0
    local left=$((deadline - SECONDS - 15))  # kept back for the verdict
    if [ "$left" -lt 15 ]; then
        echo "  $name: skipped, the ${budget} s budget is spent"
        failed+=("$name")
        return 0
    fi
    [ "$seconds" -gt "$left" ] && seconds=$left
    local start=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    echo "  $name: exit $rc after $((SECONDS - start)) s"
    if [ "$rc" != 0 ]; then
        failed+=("$name")
        tail -n 15 "$logs/$name.log" | sed 's/^/  | /'
    fi
}

# Installs the carried wheels under a prefix of their own: a venv would not see the packages of the
# image's python3, itself a venv. mpich puts mpiexec in PREFIX/bin and libmpi in PREFIX/lib, where
# mpi4py looks for it through LD_LIBRARY_PATH.
install_missing() {
    echo "+ [install] the wheels in $wheels (mpich, mpi4py, lmdb, protobuf) under $PREFIX"
    [ "$dry_run" = 1 ] && return 0
    if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
        if "$PY" -c "from mpi4py import MPI; import lmdb" 2>/dev/null && command -v mpiexec >/dev/null; then
            return 0
        fi
        echo "gpu_acceptance.sh: no MPI or lmdb here and no wheels in $wheels; run" \
             "jobs/fetch_gpu_wheels.sh $wheels where pip works, and carry the folder" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --prefix "$PREFIX" "$wheels"/*.whl || exit 2
    local site
    site=$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$PREFIX'}))")
    export PATH="$PREFIX/bin:$PATH" PYTHONPATH="$PYTHONPATH:$site" \
        LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

mkdir -p "$logs"
install_missing
[ "$dry_run" = 1 ] || { nvidia-smi; "$PY" -c "import cupy, mpi4py, lmdb; print('cupy', cupy.__version__)"; } \
    >"$logs/machine.log" 2>&1

step compile_check 120 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_cuda_compile.py
step gpu_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests
step bounds 60 "$PY" -m perf.gpu_acceptance bounds

osu() {
    for device in cuda cupy; do
        step "osu_${1}_${device}" 90 "$MPIEXEC" -n 4 "$PY" -m "perf.osu_$1" -d "$device" --impl both -m 4:268435456
    done
}
osu reduce
osu allreduce

step mnist_lmdb 60 "$PY" -m scaffe convert mnist
train="-m scaffe train --solver=examples/mnist/lenet_solver.prototxt --gpu=0 --iterations=$lenet_iterations"
# shellcheck disable=SC2086  # $train is a list of words
step train_lenet_np1_scaffe 120 "$PY" $train
for ranks in 2 4; do
    for schedule in scaffe allreduce; do
        # shellcheck disable=SC2086
        step "train_lenet_np${ranks}_${schedule}" 120 "$MPIEXEC" -n "$ranks" "$PY" $train --schedule="$schedule"
    done
done

step time_scaffe 150 "$PY" -m perf.gpu_acceptance scaffe-time
if [ "$dry_run" = 1 ] || "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    step time_torch 120 "$PY" -m perf.torch_twins
else
    echo "  (PyTorch with CUDA is not installed: no time_torch; its verdict lines read MISSING)"
fi
osu bcast

echo "+ [verdict] $PY -m perf.gpu_acceptance verdict $logs"
[ "$dry_run" = 1 ] && exit 0
[ ${#failed[@]} = 0 ] || echo "steps that failed or timed out: ${failed[*]}"
"$PY" -m perf.gpu_acceptance verdict "$logs"
