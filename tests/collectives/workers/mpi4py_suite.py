"""mpi4py's own collective test modules, run on `collectives.Comm` instead of the communicators they name.

    mpiexec -n N python mpi4py_suite.py <mpi4py's test directory> test_cco_buf test_cco_nb_buf

Every TestCase class of the modules that has a `COMM` gets a subclass whose `COMM` is
`collectives.Comm(<that communicator>)`; the classes that make their communicator in `setUp` (the Dup
variants) get theirs from our communicator's `Dup`, so our `Dup` and `Free` are exercised too. Each rank
runs the cases under unittest; the job fails when any rank saw a failure or an error.
"""
import importlib
import os
import sys
import unittest

from mpi4py import MPI

import collectives
from worker_util import Worker


def wrapped_case(case, comms):
    """A subclass of mpi4py's `case` that runs on our communicator."""
    plain = case.COMM
    if plain.py2f() not in comms:  # communicators are unhashable; their handles are not
        comms[plain.py2f()] = collectives.Comm(plain)
    namespace = {"COMM": comms[plain.py2f()]}
    if "setUp" in vars(case):  # the Dup variants make a fresh communicator for each test
        def setUp(self):
            self.COMM = type(self).COMM.Dup()
            assert isinstance(self.COMM, collectives.Comm), f"Dup gave {type(self.COMM).__name__}"
        namespace["setUp"] = setUp
    return type(case.__name__, (case,), namespace)


def drop_unusable_gpu_backends():
    """mpi4py's suite also runs real GPU arrays (numba, cupy) when those import; without a CUDA device they
    fail on the plain communicator too (numba's simulator lacks the streams they use), so they run only
    where a device is. Its fake GPU arrays (host memory behind `__cuda_array_interface__`) always run.
    Where the tests' conftest found no device (it turned numba's simulator on), the suite does not even
    import them (numba's simulator and cupy take most of a second in every rank); numba itself stays
    importable, for kernels.native to compile with on a new host."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.modules.update({"numba.cuda": None, "cupy": None})  # their imports then raise ImportError
        return
    import arrayimpl
    from numba import cuda
    if not cuda.is_available():
        arrayimpl.ArrayBackends[:] = [backend for backend in arrayimpl.ArrayBackends
                                      if backend.backend not in ("numba", "cupy", "dlpack-cupy")]


def suite(module_names, world):
    """The modules' test cases on our communicators; `world` is ours over MPI.COMM_WORLD."""
    drop_unusable_gpu_backends()
    comms = {MPI.COMM_WORLD.py2f(): world}
    loader = unittest.TestLoader()
    tests = unittest.TestSuite()
    for name in module_names:
        module = importlib.import_module(name)
        for attr in sorted(vars(module)):
            case = getattr(module, attr)
            if not (isinstance(case, type) and issubclass(case, unittest.TestCase)) or case.__module__ != name:
                continue
            if getattr(case, "COMM", None) in (None, MPI.COMM_NULL):
                continue  # a base class, or one that tests no communicator (Reduce_local)
            tests.addTests(loader.loadTestsFromTestCase(wrapped_case(case, comms)))
    return tests


class RankResult(unittest.TextTestResult):
    """Reports each failure on stderr as it happens, with the rank: a failure on one rank often leaves the
    others waiting in a collective, and the harness's timeout would otherwise hide which test it was."""

    def addError(self, test, err):
        super().addError(test, err)
        self._report("ERROR", test, self.errors[-1][1])

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._report("FAIL", test, self.failures[-1][1])

    def _report(self, kind, test, trace):
        sys.stderr.write(f"[rank {MPI.COMM_WORLD.Get_rank()}] {kind} {test}\n{trace}\n")
        sys.stderr.flush()


def main():
    test_dir, module_names = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, test_dir)
    w = Worker()
    w.case(f"mpi4py's {' '.join(module_names)}")
    # Rank 0 reports progress; every rank reports its own failures (RankResult).
    stream = sys.stdout if w.rank == 0 else open(os.devnull, "w")
    runner = unittest.TextTestRunner(stream=stream, verbosity=1, resultclass=RankResult)
    result = runner.run(suite(module_names, w.comm))
    failed = w.world.allreduce(len(result.failures) + len(result.errors))
    w.check_true(failed == 0, f"{failed} failures or errors over all ranks")
    w.check_true(result.testsRun > 0, "no test ran")
    w.cases = result.testsRun
    w.done(f"mpi4py {' '.join(module_names)} ({result.testsRun} tests per rank, {len(result.skipped)} skipped)")


if __name__ == "__main__":
    main()
