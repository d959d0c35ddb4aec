"""The suite runs under its own temporary folders (tests/conftest.py), never the user's: a disk-tier block one
test or a bench run left in ~/.local/share/mlxchat/kv-disk was once read back by another test."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from app.options import disk_kv_folder
from sessions.store import default_root

ROOT = Path(__file__).resolve().parent.parent
WHERE = ("from app.options import disk_kv_folder; from sessions.store import default_root; "
         "print(default_root()); print(disk_kv_folder())")


def suite_home() -> Path:
    home = Path(os.environ["MLXCHAT_HOME"])
    assert home.is_dir() and home.is_relative_to(tempfile.gettempdir()), home
    return home


def test_the_home_is_a_temporary_folder_of_this_worker():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert suite_home().name.startswith(f"mlxchat-test-home-{worker}-")  # each xdist worker has its own


def test_the_app_keeps_its_data_inside_it():
    assert default_root() == suite_home() / "sessions" and disk_kv_folder() == suite_home() / "kv-disk"
    assert Path(os.environ["MLXCHAT_TWINS"]).is_relative_to(suite_home())
    assert Path(os.environ["HF_HUB_CACHE"]).is_relative_to(suite_home())


def test_a_child_process_inherits_it():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    shown = subprocess.run([sys.executable, "-c", WHERE], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert shown == [str(suite_home() / "sessions"), str(suite_home() / "kv-disk")]
