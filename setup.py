"""scaffe: a CUDA-aware MPI collectives runtime co-designed with a Caffe-compatible training library."""
from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="scaffe",
    version="0.1.0",
    description="S-Caffe in Python: hierarchical pipelined MPI collectives and a Caffe-compatible trainer",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["collectives", "collectives.*", "kernels", "kernels.*",
                                    "scaffe", "scaffe.*", "perf", "perf.*"]),
    package_data={"scaffe": ["proto/*.proto"]},
    install_requires=["numpy", "mpi4py>=4", "mpich", "numba", "llvmlite", "h5py", "lmdb", "protobuf>=7.35.1",
                      "pillow", "threadpoolctl"],
    extras_require={
        # The CUDA 12 compilers from PyPI (NVRTC, and NVVM with ptxas) let CI compile every CUDA kernel
        # without a GPU (tests/kernels/test_cuda_compile.py); about 130 MB of wheels, no cupy.
        "test": ["pytest", "pytest-timeout", "grpcio-tools", "matplotlib", "ruff", "pydot",
                 "numba-cuda>=0.30", "cuda-bindings>=12.9,<13", "nvidia-cuda-nvrtc-cu12==12.*",
                 "nvidia-cuda-nvcc-cu12==12.*"],
        # A working stack on a machine with only the NVIDIA driver: cupy with the toolkit's libraries
        # (NVRTC, cuBLAS, ...) from its `ctk` extra, numba-cuda with NVVM from its own extra, and cuDNN
        # (NVIDIA's Python frontend and the runtime library) for convolution (kernels/cudnn_conv.py);
        # nvmath-python's cuBLAS bindings for the GEMMs of iterations captured into CUDA graphs (kernels/blas.py).
        "cuda12": ["cupy-cuda12x[ctk]", "numba-cuda[cu12]>=0.30", "nvidia-cudnn-frontend>=1.32",
                   "nvidia-cudnn-cu12>=9", "nvmath-python>=1.0"],
        "cuda13": ["cupy-cuda13x[ctk]", "numba-cuda[cu13]>=0.30", "nvidia-cudnn-frontend>=1.32",
                   "nvidia-cudnn-cu13>=9", "nvmath-python>=1.0"],
        "plot": ["matplotlib"],
        # caffe.io.resize_image calls scikit-image (and SciPy) as pycaffe does; without them only its
        # default, linear, interpolation is available (scaffe.skimage_resize).
        "image": ["scikit-image"],
        # scaffe.draw (pycaffe's caffe.draw) builds graphs with pydot; rendering them needs Graphviz's `dot`.
        "draw": ["pydot"],
    },
    # Caffe's tools under their own names too (scaffe.cli.TOOL_SCRIPTS), each the scaffe command of that name.
    entry_points={"console_scripts": ["scaffe = scaffe.cli:main"] + [
        f"{name} = scaffe.cli:tool_script" for name in ("convert_imageset", "convert_mnist_data", "compute_image_mean",
                                                       "extract_features", "upgrade_net_proto_text",
                                                       "upgrade_net_proto_binary", "upgrade_solver_proto_text",
                                                       "parse_log")]},
)
