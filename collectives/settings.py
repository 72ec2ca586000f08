"""Reading the SCAFFE_* environment variables that take positive integers, with one error message."""
import os


def positive_int(name, default=None):
    """The value of environment variable `name` as a positive int, `default` when unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        parsed = int(value)
    except ValueError:
        parsed = 0
    if parsed < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return parsed
