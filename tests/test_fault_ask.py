"""Faults met through `mlxchat ask --session FILE`, each run as real processes: a prompt longer than the
context, ctrl+c during prefill, a full disk. After each, the file holds nothing wrong and loses nothing, and
the next `ask` on it answers as the same conversation computed from scratch does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcore.params import GenerationParams
from process_watch import HANG_S
from session_kill_helper import engine_named
from sessions.chat_session import ChatSession
from sessions.file_format import read_header
from sessions.file_header import read_saved_session
from small_disk import small_disk  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent
PAIR = ["--model", "mini-target", "--draft", "mini-draft"]
LONG = "The quick brown fox jumps over the lazy dog. " * 140  # ~2,950 tokens: fits the 4,096-token context
TOO_LONG = LONG * 2
FIRST, SECOND = "What is 12 + 7?", "And 3 + 4?"
PARAMS = GenerationParams(max_tokens=24)  # with thinking off: what the first `ask` below saves
SETTINGS = ("--max-tokens", "24", "--no-think")

pytestmark = pytest.mark.slow


def command(session: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", "ask", "--session", str(session), *PAIR, *args]


def ask(session: Path, *args: str, stdin: str | None = None, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(command(session, *args), cwd=ROOT, input=stdin, capture_output=True, text=True,
                          timeout=HANG_S, preexec_fn=preexec, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def history(path: Path) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in read_saved_session(read_header(path), str(path)).history]


@pytest.fixture(scope="module")
def engine():
    return engine_named("embedded-paged")


def from_scratch(engine, messages: list[tuple[str, str]], text: str) -> list[tuple[str, str]]:
    """The history after ``text`` is sent to a new session that starts from ``messages``."""
    from sessions.messages import Message
    session = ChatSession(engine, params=PARAMS, enable_thinking=False)
    session.messages = [Message(role, content) for role, content in messages]
    session.send(text)
    return [(m.role, m.content) for m in session.history]


def test_a_too_long_prompt_leaves_the_session_usable(tmp_path, engine):
    path = tmp_path / "chat.mlxchat"
    assert ask(path, *SETTINGS, FIRST).returncode == 0
    saved = path.read_bytes()
    refused = ask(path, "-", stdin=TOO_LONG)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "context" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert path.read_bytes() == saved, "the refused prompt is not saved, nor an empty reply"
    again = ask(path, SECOND)  # no options: the session's own settings are kept
    assert again.returncode == 0, again.stderr
    assert history(path) == from_scratch(engine, history_before(saved, tmp_path), SECOND)


def test_a_full_kv_budget_leaves_the_session_usable(tmp_path, engine):
    path = tmp_path / "chat.mlxchat"
    assert ask(path, *SETTINGS, FIRST).returncode == 0
    saved = path.read_bytes()
    refused = ask(path, "--max-kv", "200KB", "-", stdin=LONG[:900])
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "KV cache memory is full" in refused.stderr and "--max-kv" in refused.stderr, refused.stderr
    assert path.read_bytes() == saved, "nothing of the refused turn is saved"
    again = ask(path, SECOND)  # the default budget: the chat goes on where it was
    assert again.returncode == 0, again.stderr
    assert history(path) == from_scratch(engine, history_before(saved, tmp_path), SECOND)


def history_before(data: bytes, tmp_path: Path) -> list[tuple[str, str]]:
    copy = tmp_path / "before.mlxchat"
    copy.write_bytes(data)
    return history(copy)


def test_ctrl_c_during_prefill_adds_no_empty_reply(tmp_path, engine):
    path = tmp_path / "chat.mlxchat"
    assert ask(path, *SETTINGS, FIRST).returncode == 0
    first = history(path)
    # ctrl+c as a terminal delivers it, even where the tests run in the background (`&` starts a job with
    # SIGINT ignored, and a child inherits that)
    run = subprocess.Popen(command(path, "-"), cwd=ROOT, text=True, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run.stdin.write(LONG)
    run.stdin.close()
    said = []
    for line in run.stderr:  # the notice comes as the prefill starts
        said.append(line)
        if "reading the prompt" in line:
            break
    assert said and "reading the prompt" in said[-1], f"no notice of the prefill: {''.join(said)!r}"
    run.send_signal(signal.SIGINT)
    status, rest = run.wait(HANG_S), run.stderr.read()
    assert status == 130 and "interrupted" in rest, (status, rest)
    assert history(path) == first + [("user", LONG)], "the message is kept, with no empty reply after it"
    saved = read_saved_session(read_header(path), str(path))
    assert len(saved.target.tokens) < len(ChatSession.load(path, engine).prompt_ids()) - 1, \
        "ctrl+c came during the prefill"
    after = ask(path, SECOND)
    assert after.returncode == 0, after.stderr
    assert history(path) == from_scratch(engine, first + [("user", LONG)], SECOND)


def test_a_full_disk_keeps_the_old_file_and_says_so(small_disk, engine):  # noqa: F811
    path = small_disk.folder / "chat.mlxchat"
    assert ask(path, *SETTINGS, FIRST).returncode == 0
    saved = path.read_bytes()
    small_disk.fill()
    failed = ask(path, SECOND, preexec=small_disk.preexec)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stdout.strip(), "the answer was still printed"
    reason = {"tmpfs": "No space left on device", "rlimit": "File too large"}[small_disk.kind]
    advice = {"tmpfs": "free some space", "rlimit": "larger than this system allows"}[small_disk.kind]
    assert "This turn was not saved" in failed.stderr and reason in failed.stderr and advice in failed.stderr
    assert path.read_bytes() == saved, "the old file is intact, byte for byte"
    assert not list(small_disk.folder.glob("*.tmp")), "no temporary file is left"
    small_disk.free()
    again = ask(path, SECOND)
    assert again.returncode == 0, again.stderr
    assert history(path) == from_scratch(engine, history_before(saved, small_disk.folder.parent), SECOND)


def test_a_saved_session_keeps_its_settings_unless_an_option_overrides_them(tmp_path):
    path = tmp_path / "chat.mlxchat"
    first = ask(path, "--temp", "0.7", "--top-p", "0.9", "--seed", "3", "--no-think", "--max-tokens", "8",
                "--system", "Be brief.", FIRST)
    assert first.returncode == 0, first.stderr
    assert ask(path, SECOND).returncode == 0
    header = read_saved_session(read_header(path), str(path))
    assert (header.params.temperature, header.params.top_p, header.params.seed, header.params.max_tokens) == (
        0.7, 0.9, 3, 8)
    assert header.enable_thinking is False and header.system == "Be brief."
    assert ask(path, "--temp", "0", "--think", "Why?").returncode == 0
    header = read_saved_session(read_header(path), str(path))
    assert header.params.temperature == 0.0 and header.params.top_p == 0.9 and header.enable_thinking is True


def test_a_session_file_open_elsewhere_is_refused(tmp_path):
    """Another process (a chat window, another ask) holds the file: this ask says so and writes nothing."""
    from sessions.store_lock import SessionLock
    path = tmp_path / "chat.mlxchat"
    assert ask(path, *SETTINGS, FIRST).returncode == 0
    saved = path.read_bytes()
    with SessionLock.acquire(path, mark_open=True):
        refused = ask(path, SECOND)
    assert refused.returncode == 2 and "open in another mlxchat window" in refused.stderr
    assert path.read_bytes() == saved
