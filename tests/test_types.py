"""The public APIs type-check with mypy at the level pyproject's [tool.mypy] sets (issue 34): every function
typed, no explicit Any, no Any returned where a type is declared."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_nothing_in_the_public_apis():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success" in done.stdout
