#!/usr/bin/env bash
# Downloads, here, the wheels a GPU machine lacks for jobs/gpu_acceptance.sh (its image has CUDA, cupy,
# numba-cuda and PyTorch, but no MPI library and no lmdb), for its Python 3.12 on x86-64, into one
# folder that travels with the run (git ignores /.whl/).
# Usage: bash jobs/fetch_gpu_wheels.sh [DIR]   (default .whl; then run jobs/gpu_acceptance.sh --wheels DIR there)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
# mpich brings the MPI library and mpiexec, mpi4py binds it; protobuf at the version setup.py asks for;
# the cuDNN frontend binds the image's cuDNN 9 libraries for convolution (kernels/cudnn_conv.py); nvmath-python
# binds its cuBLAS for captured GEMMs (kernels/blas.py), with the cuda-core and cuda-pathfinder it needs.
packages=(mpich mpi4py lmdb "protobuf>=7.35.1" "nvidia-cudnn-frontend>=1.32" "nvmath-python>=1.0" "cuda-core>=0.5"
          "cuda-pathfinder>=1.5.1")
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dir" "${packages[@]}"
ls -l "$dir"
