"""Reading the SCAFFE_* environment variables that take numbers or 0/1 switches, with one error message each."""
import math
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


def non_negative_seconds(name, default):
    """The value of environment variable `name` as a finite number of seconds >= 0, `default` when unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        parsed = float(value)
    except ValueError:
        parsed = -1.0
    if not (parsed >= 0 and math.isfinite(parsed)):
        raise ValueError(f"{name} must be a non-negative number of seconds (0 turns it off), got {value!r}")
    return parsed


def switch(name, default):
    """The value of environment variable `name` as a bool ("0" or "1"), `default` when unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"
