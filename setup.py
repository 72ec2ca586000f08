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
    install_requires=["numpy", "mpi4py>=4", "mpich", "numba", "h5py", "lmdb", "protobuf>=7.35.1",
                      "pillow"],
    extras_require={
        "test": ["pytest", "pytest-timeout", "grpcio-tools", "matplotlib", "ruff"],
        "cuda12": ["cupy-cuda12x"],
        "cuda13": ["cupy-cuda13x"],
        "plot": ["matplotlib"],
    },
    entry_points={"console_scripts": ["scaffe = scaffe.cli:main"]},
)
