"""Every CUDA kernel compiles for sm_80 (A100) and sm_90 (H100/H200) without a GPU, as CI runs it.

CUDA C sources registered in kernels.cuda_sources go through NVRTC from the nvidia-cuda-nvrtc wheel (by
cuda-bindings) to a cubin; numba.cuda kernels go through numba-cuda and NVVM from the nvidia-cuda-nvcc
wheel to PTX, which ptxas from the same wheel assembles. Both wheels come with the `test` extra; where
they cannot install (no wheel for the platform) the tests skip, except under CI, where they fail.
"""
import importlib
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernels.cuda_sources import ELEMENTWISE, SCALAR_TYPES, SOURCES, elementwise_name, launch, launch_elementwise

REPO = Path(__file__).resolve().parents[2]
ARCHS = (80, 90)
PACKAGES = ("collectives", "kernels", "scaffe", "perf")


def needed(module):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is missing under CI, where `pip install -e .[test]` installs it: {e}")
        pytest.skip(f"{module} cannot be imported here ({e}); `pip install -e .[test]` installs it")


def nvrtc_compile(source, arch):
    """(result code, log, cubin, PTX) of compiling `source` for sm_<arch> through NVRTC."""
    nvrtc = needed("cuda.bindings.nvrtc")
    err, program = nvrtc.nvrtcCreateProgram(source.code.encode(), f"{source.name}.cu".encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    try:
        options = [f"--gpu-architecture=sm_{arch}".encode(), *(o.encode() for o in source.options)]
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        _, log_size = nvrtc.nvrtcGetProgramLogSize(program)
        # NVRTC writes into these: fresh bytearrays, never bytes (b" " * 1 is the interpreter's shared b" ").
        log = bytearray(log_size)
        nvrtc.nvrtcGetProgramLog(program, log)
        cubin, ptx = bytearray(), bytearray()
        if result == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, cubin_size = nvrtc.nvrtcGetCUBINSize(program)
            cubin = bytearray(cubin_size)
            nvrtc.nvrtcGetCUBIN(program, cubin)
            _, ptx_size = nvrtc.nvrtcGetPTXSize(program)
            ptx = bytearray(ptx_size)
            nvrtc.nvrtcGetPTX(program, ptx)
        text = bytes(log).rstrip(b"\0").decode(errors="replace")
        return result, text, bytes(cubin), bytes(ptx).rstrip(b"\0").decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(program)


@pytest.fixture(scope="module")
def compiled():
    """(name, arch) -> nvrtc_compile's result for every source and arch, compiled side by side: NVRTC lets go
    of the GIL, and one at a time they were a tenth of the suite's in-process time."""
    needed("cuda.bindings.nvrtc")
    pairs = [(name, arch) for name in sorted(SOURCES) for arch in ARCHS]
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return dict(zip(pairs, pool.map(lambda pair: nvrtc_compile(SOURCES[pair[0]], pair[1]), pairs)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_cuda_c_source_compiles_to_a_cubin_without_warnings(compiled, name, arch):
    nvrtc = needed("cuda.bindings.nvrtc")
    result, log, cubin, _ = compiled[name, arch]
    assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{name} for sm_{arch}:\n{log}"
    assert "warning" not in log, f"{name} for sm_{arch}:\n{log}"
    assert cubin.startswith(b"\x7fELF") and len(cubin) > 1000


UPDATES = sorted(name for name in SOURCES if re.fullmatch(r"scaffe_\w+_update_float(32|64)", name))


@pytest.mark.parametrize("name", UPDATES)
def test_solver_updates_round_every_operation_as_numpy_does(compiled, name):
    """No fused multiply-add (NVRTC contracts a * b + c by default), IEEE-rounded division and square root,
    subnormals kept: the kernels then equal the per-blob pipeline bit for bit (tests/scaffe/test_gpu_training)."""
    assert len(UPDATES) == 12
    _, log, _, ptx = compiled[name, 90]
    floating = {i for i in re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z]+(?:\.[a-z0-9]+)*)", ptx, re.MULTILINE)
                if i.endswith((".f32", ".f64"))}
    assert not [i for i in floating if i.startswith("fma.")], f"{name} contracts into fused multiply-adds"
    assert not [i for i in floating if ".ftz" in i or ".approx" in i or i.startswith(("rsqrt.", "rcp."))], floating
    assert {i for i in floating if i.startswith(("div.", "sqrt."))} <= {"div.rn.f32", "sqrt.rn.f32", "div.rn.f64",
                                                                       "sqrt.rn.f64"}, floating


def test_a_broken_source_fails_with_its_log():
    nvrtc = needed("cuda.bindings.nvrtc")
    broken = SOURCES["scaffe_im2col_float32"]
    broken = type(broken)(broken.name, broken.code.replace("col[i] =", "col[i] = undeclared +"))
    result, log, _, _ = nvrtc_compile(broken, 90)
    assert result != nvrtc.nvrtcResult.NVRTC_SUCCESS and "undeclared" in log


def test_numba_kernels_compile_through_nvvm_and_assemble():
    needed("numba_cuda")
    needed("cuda.pathfinder")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    # One process per architecture, side by side: numba's compiles hold the GIL.
    worker = REPO / "tests/kernels/workers/compile_numba_kernels.py"
    workers = [subprocess.Popen([sys.executable, str(worker), str(arch)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for arch in ARCHS]
    results = []
    for process in workers:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stdout[-2000:] + stderr[-4000:]
        results += [json.loads(line) for line in stdout.splitlines()]
    names = {r["name"] for r in results}
    assert {"reduce_sum_float32", "reduce_min_float64", "reduce_bxor_uint8", "reduce_prod_complex64"} <= names
    for r in results:
        assert r["target"] == f"sm_{r['cc']}" and r["ptxas_rc"] == 0, r
    assert sorted((r["name"], r["cc"]) for r in results) == sorted((n, cc) for n in names for cc in ARCHS)
    # Every module defining a numba.cuda kernel has its kernels listed for this check.
    assert {r["module"] for r in results} == set(_modules_matching(r"@cuda\.jit(?!\(device=True)"))


def _modules_matching(pattern, exclude=()):
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if module not in exclude and re.search(pattern, path.read_text(encoding="utf-8")):
                found.append(module)
    return found


def test_every_cupy_kernel_is_built_from_the_registry():
    # A kernel built from a string elsewhere would escape the compile check above.
    built_elsewhere = _modules_matching(r"\b(RawKernel|RawModule|ElementwiseKernel|ReductionKernel)\(|cupy\.fuse\b",
                                        exclude=("kernels.cuda_sources",))
    assert built_elsewhere == [], f"register these kernels in kernels/cuda_sources.py: {built_elsewhere}"


LAUNCHED = sorted([elementwise_name(base, d) for base, dtypes in ELEMENTWISE.items() for d in dtypes]
                  + ["scaffe_bound_sum4_float32", "scaffe_bound_allreduce4_float32"])  # the kernels `launch` runs


@pytest.mark.parametrize("name", LAUNCHED)
def test_every_parameter_is_a_pointer_or_a_scalar_launch_can_pass(name):
    parameters = SOURCES[name].parameters
    assert parameters and all(t.endswith("*") or t in SCALAR_TYPES for t, _ in parameters), parameters


def test_launch_refuses_arguments_that_do_not_fit_the_kernel():
    # Checked before cupy is imported: a RawKernel itself would read whatever it was given.
    with pytest.raises(TypeError, match=r"scaffe_im2col_float32 takes 17 arguments \(x, n_img,"):
        launch("scaffe_im2col_float32", 1, 1, 1, 2)
    with pytest.raises(ValueError, match="x must be a C-contiguous cupy array"):
        launch("scaffe_im2col_float32", 1, 1, *range(17))
    with pytest.raises(TypeError, match="scaffe_col2im: no GPU kernel for int32; there are kernels for float32, float64"):
        launch_elementwise("scaffe_col2im", "int32", 4, *range(16))
