"""A stand-in for NVIDIA's nvmath-python, for tests only: its cuBLAS bindings on the cupy stand-in's memory
(the `nvmath_stand_in` fixture of tests/conftest.py puts it first on sys.path)."""
