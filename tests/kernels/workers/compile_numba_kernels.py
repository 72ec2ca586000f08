"""Compiles every numba.cuda kernel of kernels.cuda_sources.numba_kernels() through NVVM for each compute
capability given (e.g. `80 90`) and assembles the PTX with ptxas for that architecture; prints one JSON
line per (kernel, cc). Runs without a GPU, but not under the CUDA simulator (it has no compiler)."""
import json
import os
import subprocess
import sys
import tempfile

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    sys.exit("compile_numba_kernels: unset NUMBA_ENABLE_CUDASIM; the simulator has no compiler")

from cuda.pathfinder import find_nvidia_binary_utility  # noqa: E402

from collectives.ops import supports  # noqa: E402
from kernels.cuda_sources import numba_kernels  # noqa: E402
from kernels.numba_cuda import cuda  # noqa: E402


def main(ccs):
    ptxas = find_nvidia_binary_utility("ptxas")
    if ptxas is None:
        sys.exit("compile_numba_kernels: no ptxas (pip install nvidia-cuda-nvcc-cu12)")
    with tempfile.TemporaryDirectory() as tmp:
        for entry in numba_kernels(supports):
            for cc in ccs:
                ptx, _ = cuda.compile_ptx(entry.py_func, entry.signature, cc=(cc // 10, cc % 10))
                path = os.path.join(tmp, f"{entry.name}_{cc}.ptx")
                with open(path, "w") as f:
                    f.write(ptx)
                assembled = subprocess.run([ptxas, f"--gpu-name=sm_{cc}", "-o", os.devnull, path],
                                           capture_output=True, text=True)
                target = next((line.split()[1] for line in ptx.splitlines() if line.startswith(".target")), None)
                print(json.dumps({"name": entry.name, "module": entry.module, "cc": cc, "target": target,
                                  "ptxas_rc": assembled.returncode, "ptxas_err": assembled.stderr[-500:]}),
                      flush=True)


if __name__ == "__main__":
    main([int(cc) for cc in sys.argv[1:]])
