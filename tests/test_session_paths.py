"""Where a session is saved (issue 31): folders, missing folders, symlinks and what killed saves leave behind,
through the CLI as a user runs it: one line and status 2 for a mistake, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessions.file_format import read_header
from sessions.file_header import read_saved_session
from sessions.store_lock import SessionLock
from test_cli import ROOT, mlxchat

SETTINGS = ["--model", "mini-target", "--draft", "mini-draft", "--no-think", "--max-tokens", "4"]


def ask(home: Path, session: str | Path, text: str = "What is 12 + 7?") -> subprocess.CompletedProcess:
    return mlxchat("ask", "--session", str(session), *SETTINGS, text, env={"MLXCHAT_HOME": str(home)})


def sessions(home: Path, *args: str) -> subprocess.CompletedProcess:
    return mlxchat("sessions", *args, env={"MLXCHAT_HOME": str(home)})


def assert_one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mlxchat:") and all(word in last for word in words), result.stderr


def history(path: Path) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in read_saved_session(read_header(path), str(path)).history]


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("where", [".", "..", "/", "folder"])
def test_a_folder_as_session_is_one_line(tmp_path, where):
    (tmp_path / "folder").mkdir()
    before = sorted(tmp_path.parent.rglob("*"))
    result = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--session", where, *SETTINGS, "hi"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, HF_HUB_OFFLINE="1", MLXCHAT_HOME=str(tmp_path / "home"),
                                     PYTHONPATH=str(ROOT)))
    assert_one_line(result, "folder")
    assert sorted(tmp_path.parent.rglob("*")) == before, "nothing written (no lock files either)"


def test_a_session_in_a_missing_folder_is_one_line(tmp_path):
    assert_one_line(ask(tmp_path, tmp_path / "missing" / "chat.mlxchat"), "does not exist")
    assert not (tmp_path / "missing").exists()


def stored_chat(home: Path) -> str:
    """A chat in the store's folder (an earlier version's file, listed and exported as it is): its id."""
    (home / "sessions").mkdir(parents=True, exist_ok=True)
    assert ask(home, home / "sessions" / "chat.mlxchat").returncode == 0
    return "chat"


@pytest.mark.parametrize("name", ["x.md", "x.mlxchat"])
def test_export_where_it_cannot_be_written_is_one_line(tmp_path, name):
    chat = stored_chat(tmp_path)
    (tmp_path / "file").write_text("a plain file, not a folder")
    for target in (tmp_path / "missing" / name, tmp_path / "file" / name, Path("/proc") / name):
        assert_one_line(sessions(tmp_path, "export", chat, "-o", str(target)), str(target))
    assert not (tmp_path / "missing").exists()


def test_a_symlinked_session_stays_a_link_and_its_target_is_saved(tmp_path):
    real, link = tmp_path / "real.mlxchat", tmp_path / "link.mlxchat"
    assert ask(tmp_path, real).returncode == 0
    link.symlink_to(real.name)
    again = ask(tmp_path, link, "And 3 + 4?")
    assert again.returncode == 0, again.stderr
    assert link.is_symlink() and os.readlink(link) == real.name
    assert [text for _, text in history(real)][::2] == ["What is 12 + 7?", "And 3 + 4?"]
    with SessionLock.acquire(real, mark_open=True):  # the lock is the target's, whichever name opens it
        assert_one_line(ask(tmp_path, link, "Once more?"), "open in another mlxchat window")


def left_over(*temps: Path) -> None:
    """Temporary files last written two minutes ago (one just written may be another machine's live write)."""
    for temp in temps:
        temp.write_bytes(b"half a session")
        os.utime(temp, (time.time() - 120, time.time() - 120))


def test_a_save_sweeps_temporary_files_of_dead_processes(tmp_path):
    dead, alive = tmp_path / f".chat.mlxchat.{dead_pid()}.tmp", tmp_path / f".other.mlxchat.{os.getpid()}.tmp"
    fresh = tmp_path / f".new.mlxchat.{dead_pid()}.tmp"
    left_over(dead, alive)
    fresh.write_bytes(b"being written")
    assert ask(tmp_path, tmp_path / "chat.mlxchat").returncode == 0
    assert not dead.exists() and alive.exists() and fresh.exists()


def test_opening_the_store_sweeps_temporary_files_of_dead_processes(tmp_path):
    chat = stored_chat(tmp_path)
    folder = tmp_path / "sessions"
    dead, alive = folder / f".{chat}.mlxchat.{dead_pid()}.tmp", folder / f".{chat}.mlxchat.{os.getpid()}.tmp"
    left_over(dead, alive)
    assert sessions(tmp_path, "ls").returncode == 0
    assert not dead.exists() and alive.exists()
