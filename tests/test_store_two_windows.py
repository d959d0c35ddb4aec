"""Two mlxchat windows on one session store, each in its own process: no chat lost, none brought back.

The store-level tests drive tests/store_window_helper.py processes (a store holding one
open chat, as the TUI's engine host does); the last test runs two real engine hosts
(the TUI's child process) on the embedded model. Every step waits for the other
process's answer on its pipe: nothing is ordered by time.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import mlxcore  # noqa: F401
from app.cli import main as cli_main
from app.engine_host import protocol as p
from sessions.errors import SessionInUseError
from sessions.store import SessionStore
from sessions.store_lock import SessionLock, is_open, lock_file, open_file

ROOT = Path(__file__).resolve().parent.parent
HELPER = Path(__file__).with_name("store_window_helper.py")
WAIT_S = 60  # only a bound for a process that hangs: every wait ends on an answer


class Window:
    """A store_window_helper process: one JSON command line in, one JSON answer line out."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(HELPER)], cwd=ROOT, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")  # the process ended

    def answer(self) -> dict:
        line = self.lines.get(timeout=WAIT_S)
        assert line, f"the window process ended (exit status {self.process.wait()})"
        return json.loads(line)

    def post(self, do: str, **fields: object) -> None:
        self.process.stdin.write(json.dumps({"do": do, **fields}) + "\n")
        self.process.stdin.flush()

    def ask(self, do: str, **fields: object) -> dict:
        self.post(do, **fields)
        return self.answer()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(WAIT_S)


@pytest.fixture(scope="module")
def pool():
    """The window processes, shared by the tests (starting one takes seconds); a killed one is replaced."""
    started: list[Window] = []
    yield started
    for window in started:
        window.close()


@pytest.fixture
def windows(pool, tmp_path) -> tuple[Window, Window]:
    """Two windows, each in its own process, on a new store in ``tmp_path / "sessions"``."""
    pool[:] = [window for window in pool if window.process.poll() is None]
    fresh = [Window() for _ in range(2 - len(pool))]
    for window in fresh:  # started together, so their imports overlap
        assert "ready" in window.answer()
    pool.extend(fresh)
    for window in pool:
        assert window.ask("use", root=str(tmp_path / "sessions")) == {}
    return pool[0], pool[1]


def stored(root: Path) -> dict[str, list[str]]:
    """Every chat on disk: id -> its user turns, read by a third process (this one) that holds nothing."""
    store = SessionStore(root)
    return {info.id: [m.content for m in store.read(info.id).history if m.role == "user"] for info in store.list()}


def test_a_chat_open_in_one_window_cannot_be_deleted_from_another(windows, tmp_path, capsys):
    a, b = windows
    chat = a.ask("new", text="Plan a picnic")["id"]
    refused = b.ask("rm", chat=chat)
    assert refused["error"] == "SessionInUseError" and "not deleted" in refused["message"]
    assert cli_main(["sessions", "--store", str(tmp_path / "sessions"), "rm", chat]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "open in another mlxchat window, so it was not deleted" in err
    assert a.ask("say", text="Bring lemonade")["turns"] == ["Plan a picnic", "Bring lemonade"]
    assert stored(tmp_path / "sessions") == {chat: ["Plan a picnic", "Bring lemonade"]}, "A's autosave kept it"

    a.ask("new", text="Another chat")  # A leaves the picnic: it may be deleted now, and stays deleted
    assert b.ask("rm", chat=chat) == {}
    assert a.ask("say", text="Still here")["id"] != chat
    assert chat not in stored(tmp_path / "sessions")
    gone = tmp_path / "sessions" / f"{chat}.mlxchat"
    assert not lock_file(gone).exists() and not open_file(gone).exists(), "its lock files went with it"


def test_both_windows_open_the_same_chat_in_turn(windows, tmp_path, capsys):
    a, b = windows
    chat = a.ask("new", text="first from A")["id"]
    refused = b.ask("open", chat=chat)
    assert refused["error"] == "SessionInUseError" and "open in another mlxchat window" in refused["message"]
    assert b.ask("rename", chat=chat, title="B's name")["error"] == "SessionInUseError"
    assert {c["id"]: c["open_elsewhere"] for c in b.ask("ls")["chats"]} == {chat: True}
    assert a.ask("ls")["chats"][0]["open_elsewhere"] is False, "A has it open itself"
    assert cli_main(["sessions", "--store", str(tmp_path / "sessions"), "ls"]) == 0
    assert "(open in an mlxchat window)" in capsys.readouterr().out

    a.ask("say", text="second from A")
    a.ask("new", text="elsewhere")  # A switches away: B may open the chat now, with A's turns
    assert b.ask("open", chat=chat)["turns"] == ["first from A", "second from A"]
    assert a.ask("open", chat=chat)["error"] == "SessionInUseError"
    b.ask("say", text="third from B")
    assert stored(tmp_path / "sessions")[chat] == ["first from A", "second from A", "third from B"]


def test_two_windows_making_new_chats_at_once_get_different_ids(windows, tmp_path):
    a, b = windows
    for window in windows:  # both propose 20250101-000000-0000, -0001, ... in the same order
        window.ask("use", root=str(tmp_path / "sessions"), same_ids=True)
    a.post("new-many", count=12, tag="A")
    b.post("new-many", count=12, tag="B")
    answers = a.answer(), b.answer()
    assert all("ids" in answer for answer in answers), answers
    ids_a, ids_b = answers[0]["ids"], answers[1]["ids"]
    assert len(set(ids_a) | set(ids_b)) == 24, "no id was given to both windows"
    on_disk = stored(tmp_path / "sessions")
    assert {i: on_disk[i] for i in ids_a} == {i: [f"A {n}"] for n, i in enumerate(ids_a)}
    assert {i: on_disk[i] for i in ids_b} == {i: [f"B {n}"] for n, i in enumerate(ids_b)}, "nothing overwritten"


def test_a_killed_window_leaves_its_chat_openable_at_once(windows, tmp_path):
    holder, other = windows
    chat = holder.ask("new", text="before the crash")["id"]
    assert other.ask("open", chat=chat)["error"] == "SessionInUseError"
    assert other.ask("ls")["chats"] == [{"id": chat, "messages": 2, "open_elsewhere": True}]
    holder.process.kill()  # SIGKILL: no handler, no cleanup; the OS drops its locks
    holder.process.wait(WAIT_S)
    assert other.ask("ls")["chats"] == [{"id": chat, "messages": 2, "open_elsewhere": False}]
    assert other.ask("open", chat=chat)["turns"] == ["before the crash"]
    assert other.ask("say", text="after it")["turns"] == ["before the crash", "after it"]


# --- the lock alone (one process: two acquisitions conflict there too) ------------------------

def test_lock_is_exclusive_shows_open_and_goes_with_the_chat(tmp_path):
    path = tmp_path / "chat.mlxchat"
    assert not is_open(path)
    with SessionLock.acquire(path, mark_open=True):
        assert is_open(path)
        with pytest.raises(SessionInUseError, match="open in another mlxchat window"):
            SessionLock.acquire(path)
    assert not is_open(path)
    SessionLock.acquire(path).remove()
    assert not lock_file(path).exists() and not open_file(path).exists()


def test_an_is_open_probe_never_makes_a_taker_fail(tmp_path):
    path = tmp_path / "chat.mlxchat"
    SessionLock.acquire(path, mark_open=True).release()
    probe = os.open(open_file(path), os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # where is_open holds it, caught half way
        SessionLock.acquire(path).release()  # an open from the CLI or the salvage writer still gets in
        assert is_open(path) is False, "probes share: two windows listing at once both see it closed"
    finally:
        os.close(probe)


def test_lock_module_does_not_import_mlx():
    code = "import sys, sessions.store_lock; assert 'mlx.core' not in sys.modules and 'mlx' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# --- two real engine hosts (the TUI's child process), as two mlxchat windows run them -----------

class EngineWindow:
    """A TUI engine host process on the embedded model; its events arrive in a queue, in order."""

    def __init__(self) -> None:
        from app.tui.engine_client import EngineClient
        self.events: queue.Queue = queue.Queue()
        self.client = EngineClient(self.events.put)
        self.client.start()
        self.client.send(p.Open(model="mini-target", no_draft=True, think=False,
                                params={"max_tokens": 4, "temperature": 0.0}))

    def wait(self, kind: type, test=lambda event: True):
        """The next event of ``kind`` that passes ``test`` (a Failure on the way fails the test)."""
        while True:
            event = self.events.get(timeout=WAIT_S)
            assert kind is p.Failure or not isinstance(event, p.Failure), event
            if isinstance(event, kind) and test(event):
                return event

    def do(self, command: object, last: type):
        """Send ``command`` and wait for ``last``, the final event it causes (so later waits start clean)."""
        self.client.send(command)
        return self.wait(last)

    def turn(self, text: str) -> p.Conversation:
        self.client.send(p.Send(text))
        self.wait(p.Done)
        return self.wait(p.Conversation)  # after the autosave


def user_turns(conversation: p.Conversation) -> list[str]:
    return [content for role, content in conversation.messages if role == "user"]


@pytest.mark.slow
def test_two_tui_engine_hosts_neither_lose_nor_resurrect_a_chat(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))  # the engine processes inherit it
    root = tmp_path / "sessions"
    a, b = EngineWindow(), EngineWindow()
    try:
        a.wait(p.Conversation)
        b.wait(p.Conversation)
        chat = a.turn("Plan a picnic").session_id
        assert chat is not None

        refused = b.do(p.ManageSession("delete", chat), p.Failure)
        assert refused.code is p.FailureCode.IN_USE and "not deleted" in refused.message
        assert b.do(p.OpenSession(chat), p.Failure).code is p.FailureCode.IN_USE
        rows = b.do(p.ListSessions(), p.Sessions).rows
        assert [(r.session_id, r.open_elsewhere) for r in rows] == [(chat, True)]
        assert user_turns(a.turn("Bring lemonade")) == ["Plan a picnic", "Bring lemonade"]
        assert stored(root) == {chat: ["Plan a picnic", "Bring lemonade"]}, "B's delete did not happen"

        assert a.do(p.Chat("new"), p.Conversation).session_id is None  # A leaves the chat: B may open it
        opened = b.do(p.OpenSession(chat), p.Conversation)
        assert (opened.session_id, user_turns(opened)) == (chat, ["Plan a picnic", "Bring lemonade"])
        assert a.do(p.OpenSession(chat), p.Failure).code is p.FailureCode.IN_USE
        b.turn("And sandwiches")
        b.do(p.ManageSession("delete", chat), p.Sessions)  # B deletes the chat it has open
        other = a.turn("Something else").session_id
        assert stored(root) == {other: ["Something else"]}, "the deleted chat stays deleted"
    finally:
        a.client.close()
        b.client.close()
