"""Fault: the chat window's process is killed (SIGKILL) while the engine is busy or idle.

The window runs as users run it (tests/tui_process_helper.py: the real ChatApp, its
engine a child process over a pipe). After the kill, the engine process must be gone
within 2 s, and nothing may be lost: the session store holds the user's message and
the reply as far as it got, and the next turn on that chat answers exactly as a
conversation with the same history computed from scratch does.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from process_watch import HANG_S, Lines, seconds_until_gone
from session_kill_helper import engine_named
from sessions.chat_session import ChatSession
from sessions.store import SessionStore
from tui_process_helper import LONG_PROMPT, SHORT, STORY
from turn_checks import send_matching_a_cold_run

ROOT = Path(__file__).resolve().parent.parent
HELPER = Path(__file__).with_name("tui_process_helper.py")
MARKERS = {"idle": "IDLE", "reply": "STREAMING", "prefill": "PREFILLING"}
# The watch gives the host 0.8 s, then waits for a save in progress (lifeline.py); on a host whose cores other
# test processes share, that save alone has taken over a second.
GONE_WITHIN_S = 5.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    return engine_named("embedded-paged")


def kill_the_window(scenario: str, home: Path, env: dict[str, str] | None = None,
                    moment: threading.Event | None = None) -> float | None:
    """Play ``scenario`` in a window process, SIGKILL it at its marker (or at ``moment``); seconds until its
    engine was gone."""
    window = subprocess.Popen([sys.executable, str(HELPER), scenario], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              env={**os.environ, "MLXCHAT_HOME": str(home), **(env or {})})
    lines = Lines(window)
    try:
        engine_pid = int(lines.until("ENGINE ").split()[1])
        if moment is None:
            lines.until(MARKERS[scenario])
        else:
            assert moment.wait(HANG_S), "the engine never started its download"
    finally:
        window.kill()
        window.wait()
    took = seconds_until_gone(engine_pid, GONE_WITHIN_S)
    if took is None:
        os.kill(engine_pid, signal.SIGKILL)  # leave nothing running behind a failed test
    return took


def the_stored_chat(home: Path) -> tuple[SessionStore, str]:
    store = SessionStore(home / "sessions")
    infos = store.list()
    assert len(infos) == 1, f"one chat was stored, not {[i.id for i in infos]}"
    return store, infos[0].id


def next_turn_matches_a_cold_run(stored: tuple[SessionStore, str], engine) -> ChatSession:
    """The next turn on the saved chat answers as the same prompt computed from scratch (see turn_checks)."""
    store, chat = stored
    session = store.load(chat, engine)
    session.params = dataclasses.replace(session.params, max_tokens=16)
    send_matching_a_cold_run(session, "Go on.")
    return session


def test_window_killed_mid_reply(tmp_path, engine):
    took = kill_the_window("reply", tmp_path)
    assert took is not None, f"the engine process still ran {GONE_WITHIN_S} s after its window was killed"
    stored = the_stored_chat(tmp_path)
    history = stored[0].read(stored[1]).history
    assert [m.role for m in history] == ["user", "assistant"] and history[0].content == STORY
    assert history[1].content.strip(), "the reply as far as it got is kept"
    session = next_turn_matches_a_cold_run(stored, engine)
    assert session.last_stats.reused_tokens > 0, "the saved cache serves the next turn"


def test_window_killed_mid_prefill(tmp_path, engine):
    took = kill_the_window("prefill", tmp_path)
    assert took is not None, f"the engine process still ran {GONE_WITHIN_S} s after its window was killed"
    stored = the_stored_chat(tmp_path)
    saved = stored[0].read(stored[1])
    assert [(m.role, m.content) for m in saved.history] == [("user", LONG_PROMPT)], \
        "the message is kept, and no empty reply is added"
    prompt = stored[0].load(stored[1], engine).prompt_ids()
    assert len(saved.target.tokens) < len(prompt) - 1, "the prefill was stopped part way"
    next_turn_matches_a_cold_run(stored, engine)


def test_window_killed_while_idle(tmp_path, engine):
    took = kill_the_window("idle", tmp_path)
    assert took is not None, f"the engine process still ran {GONE_WITHIN_S} s after its window was killed"
    stored = the_stored_chat(tmp_path)
    reference = ChatSession(engine, params=stored[0].load(stored[1], engine).params)
    reference.send(SHORT)
    saved = stored[0].read(stored[1])
    assert saved.history == tuple(reference.history)
    next_turn_matches_a_cold_run(stored, engine)


class StalledHub:
    """A hub on a loopback port that takes every request and never answers: a download that hangs."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.asked = threading.Event()
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.held.append(connection)
            if connection.recv(4096):  # the request's first bytes: the download has begun
                self.asked.set()

    def close(self) -> None:
        self.server.close()
        for connection in self.held:
            connection.close()


def test_window_killed_mid_download(tmp_path):
    hub = StalledHub()
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "MLXCHAT_OFFLINE": "0"}
    try:
        took = kill_the_window("download", tmp_path, env, moment=hub.asked)
    finally:
        hub.close()
    assert took is not None, f"the engine process still ran {GONE_WITHIN_S} s after its window was killed"
