"""One temporary home per test process, set before collection so that every child process inherits it.

Without it the app's data (the session store and the KV disk tier, under ``$MLXCHAT_HOME``), the twins the
bench builds and the hub cache went to the real user's folders, and a block one run left there was read back
by another test. Each pytest-xdist worker configures itself, so each has its own; a test that sets its own
home (``monkeypatch.setenv``) still does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    home = Path(tempfile.mkdtemp(prefix=f"mlxchat-test-home-{worker}-"))
    config.stash[HOME] = home
    os.environ["MLXCHAT_HOME"] = str(home)  # the session store and the KV disk tier
    os.environ["MLXCHAT_TWINS"] = str(home / "twins")  # tests that build twins share theirs (twin_fixtures)
    os.environ["HF_HOME"] = str(home / "huggingface")  # read once when huggingface-hub is imported: set first
    os.environ["HF_HUB_CACHE"] = str(home / "huggingface" / "hub")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash[HOME], ignore_errors=True)
