#!/usr/bin/env bash
# The GPU acceptance of issues 18, 22 and 25 in one command on one GPU (an H100 or H200), about 5 minutes:
#   1. installs what the machine lacks (mpich, mpi4py, lmdb, protobuf) from wheels carried along
#      (made here by jobs/fetch_gpu_wheels.sh), beside the image's own packages;
#   2. the device bounds: fused 4-input Reduce and Allreduce kernels, device-to-device copy rates;
#   3. OSU Reduce and Allreduce with 4 ranks sharing the GPU, cupy (-d cupy) and numba (-d cuda) buffers,
#      staged and scaffe side by side (--impl both), 4 B to 256 MiB;
#   4. the `gpu`-marked tests;
#   5. OSU Bcast, the same way;
#   6. LeNet trained on the GPU with 1, 2 and 4 ranks sharing it (both schedules), then cifar10_quick with
#      1, 2 and 4 ranks, on CIFAR-10 where its LMDBs are on the machine (examples/cifar10/README.md), else
#      on the bundled MNIST digits drawn as 3 x 32 x 32 images (`perf.gpu_acceptance cifar-digits`);
#   7. ms/iter of scaffe and PyTorch eager (if installed) on the timed nets;
#   8. `scaffe time` layer by layer on AlexNet b128 and GoogLeNet b32, and their layers' device times, the
#      check of the compute model's h100 (python -m perf.model_check LOGS/layers_alexnet_b128.log
#      --model LOGS/alexnet_b128.prototxt compares them), and where a device Reduce's host time goes;
#   9. the verdict table against the acceptance lines (exit status 1 unless every line passes).
# The order is what the verdict needs most first. Every step logs to LOGS/<step>.log and its exit status to
# LOGS/steps.tsv; a failed, timed-out or skipped step gives FAIL or MISSING rows and the rest still run.
# Each step's limit is its share of one time budget (--budget, default 450 s; the shares add up to at most
# the budget), of what is left of it when earlier steps finished early, so the verdict is always printed
# in time.
#
# Usage: bash jobs/gpu_acceptance.sh [--dry-run] [--wheels DIR] [--logs DIR] [--budget SECONDS]
#                                    [--lenet-iterations N] [--cifar-iterations N]
#   --dry-run  print the plan (every command with its limit) and run nothing; needs no GPU
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

dry_run=0
wheels=.whl
logs=/tmp/scaffe_gpu_acceptance
lenet_iterations=500
cifar_iterations=500
budget=450
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --wheels) wheels=$2; shift ;;
        --logs) logs=$2; shift ;;
        --budget) budget=$2; shift ;;
        --lenet-iterations) lenet_iterations=$2; shift ;;
        --cifar-iterations) cifar_iterations=$2; shift ;;
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

RESERVE=15  # seconds kept back for the verdict
shares_left=100
# step NAME PERCENT COMMAND...: runs COMMAND with output to LOGS/NAME.log and its exit status (124: timed
# out) or "skipped" in LOGS/steps.tsv, for at most its share of the time left: PERCENT of the budget when
# every earlier step took all of its own (what the dry run prints), more when they finished early.
step() {
    local name=$1 share=$2
    shift 2
    local seconds=$(( (budget - RESERVE) * share / 100 ))
    if [ "$dry_run" = 1 ]; then
        echo "+ [$name, at most ${seconds}s] $*"
        return 0
    fi
    local left=$((deadline - SECONDS - RESERVE))
    seconds=$(( left * share / shares_left ))
    shares_left=$((shares_left - share))
    [ "$seconds" -lt 5 ] && seconds=5  # a small share on a small budget still gets a chance
    echo "+ [$name, at most ${seconds}s] $*"
    if [ "$left" -lt "$seconds" ]; then
        echo "  $name: skipped, the ${budget} s budget is spent"
        printf '%s\tskipped\n' "$name" >>"$logs/steps.tsv"
        failed+=("$name")
        return 0
    fi
    local start=$SECONDS
    timeout --kill-after=5 "$seconds" "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\n' "$name" "$rc" >>"$logs/steps.tsv"
    echo "  $name: exit $rc after $((SECONDS - start)) s"
    if [ "$rc" != 0 ]; then
        failed+=("$name")
        tail -n 8 "$logs/$name.log" | sed 's/^/  | /'
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
[ "$dry_run" = 1 ] || rm -f "$logs"/*.log "$logs/steps.tsv"  # a verdict reads this run's logs only
install_missing
[ "$dry_run" = 1 ] || { nvidia-smi; "$PY" -c "import cupy, mpi4py, lmdb; print('cupy', cupy.__version__)"
    "$PY" -c "from kernels import blas; print('captured GEMMs:', blas.capture_refusal() or 'ready')"; } \
    >"$logs/machine.log" 2>&1

osu() {  # osu BENCH DEVICE PERCENT
    step "osu_${1}_${2}" "$3" "$MPIEXEC" -n 4 "$PY" -m "perf.osu_$1" -d "$2" --impl both -m 4:268435456
}
train() {  # train NET SOLVER ITERATIONS RANKS SCHEDULE PERCENT
    local command=("$PY" -m scaffe train "--solver=$2" --gpu=0 "--iterations=$3")
    [ "$4" = 1 ] || command=("$MPIEXEC" -n "$4" "${command[@]}" "--schedule=$5")
    step "train_${1}_np${4}_${5}" "$6" "${command[@]}"
}

step bounds 2 "$PY" -m perf.gpu_acceptance bounds
for device in cupy cuda; do
    osu reduce "$device" 7
    osu allreduce "$device" 7
done
step gpu_tests 9 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests
for device in cupy cuda; do
    osu bcast "$device" 4
done
step mnist_lmdb 1 "$PY" -m scaffe convert mnist
train lenet examples/mnist/lenet_solver.prototxt "$lenet_iterations" 1 scaffe 3
step train_lenet_np1_eager 3 env SCAFFE_CAPTURE=0 "$PY" -m scaffe train --solver=examples/mnist/lenet_solver.prototxt \
    --gpu=0 "--iterations=$lenet_iterations"
for ranks in 2 4; do
    for schedule in scaffe allreduce; do
        train lenet examples/mnist/lenet_solver.prototxt "$lenet_iterations" "$ranks" "$schedule" 4
    done
done
cifar_solver=examples/cifar10/cifar10_quick_solver.prototxt
if [ ! -d examples/cifar10/cifar10_train_lmdb ]; then  # CIFAR-10 is not bundled: the digits drawn CIFAR-sized
    cifar_solver=$logs/cifar_digits/solver.prototxt
    step cifar_digits 1 "$PY" -m perf.gpu_acceptance cifar-digits "$logs/cifar_digits" --iterations="$cifar_iterations"
fi
for ranks in 1 2 4; do
    train cifar10_quick "$cifar_solver" "$cifar_iterations" "$ranks" scaffe 3
done
step time_scaffe 6 "$PY" -m perf.gpu_acceptance scaffe-time
if [ "$dry_run" = 1 ] || "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    step time_torch 3 "$PY" -m perf.torch_twins
else
    echo "  (PyTorch with CUDA is not installed: no time_torch; its verdict lines read MISSING)"
fi

profile() {  # profile NET BATCH PERCENT: `scaffe time`'s per-layer log of NET's train net at BATCH, and the
    # layers' device times by CUDA events (perf/layer_times.py), which perf/model_check.py compares with the model
    local net_file=$logs/${1}_b${2}.prototxt
    [ "$dry_run" = 1 ] || "$PY" -m perf.gpu_acceptance train-net "$1" "$2" "$net_file"
    step "profile_${1}_b${2}" "$3" "$PY" -m scaffe time "--model=$net_file" --gpu=0 --iterations=10
    step "layers_${1}_b${2}" "$3" "$PY" -m perf.layer_times "--model=$net_file"
}
profile alexnet 128 2
profile googlenet 32 2
# Where a repeated device Reduce's host time goes (cProfile's top functions on the root), at 64 MiB: the
# large-message lines miss by a fixed cost a call.
step device_overhead 2 "$MPIEXEC" -n 4 "$PY" perf/device_overhead.py --device cupy --count 16777216 --top 15

echo "+ [verdict] $PY -m perf.gpu_acceptance verdict $logs"
[ "$dry_run" = 1 ] && exit 0
[ ${#failed[@]} = 0 ] || echo "steps that failed, timed out or were skipped: ${failed[*]}"
"$PY" -m perf.gpu_acceptance verdict "$logs"
