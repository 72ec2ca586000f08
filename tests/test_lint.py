"""ruff over the tree: pyflakes (unused imports and locals, undefined names, shadowed imports) and the
complexity limit (C901) that pyproject.toml sets."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _function_with_branches(branches):
    """Source of a function whose McCabe complexity is branches + 1."""
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(branches))
    return f"def f(x):\n{body}    return -1\n"


@pytest.mark.parametrize("branches,flagged", [(9, False), (10, True)])
def test_ruff_enforces_the_complexity_limit(branches, flagged):
    pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "--stdin-filename", "probe.py", "-"], input=_function_with_branches(branches),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ("C901" in done.stdout) == flagged, done.stdout + done.stderr
