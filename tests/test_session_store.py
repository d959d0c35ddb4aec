"""The session store and `mlxchat sessions`: list, info, rename, delete, search, export, autosave."""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from pathlib import Path

import pytest

from tiny_models import tiny_qwen3

import mlxcore  # noqa: F401
from app.sessions_cmd import add_sessions_parser, run_sessions
from mlxcore.engine import Engine, KVConfig
from mlxcore.errors import MlxchatError
from mlxcore.params import GenerationParams
from sessions import store as store_module
from sessions.chat_session import ChatSession
from sessions.errors import SessionFileError, SessionNotFoundError
from sessions.file_append import rewrite_header
from sessions.file_format import encode_header, read_header
from sessions.messages import Message
from sessions.store import SessionStore, default_root

THOUGHT = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"


@pytest.fixture(scope="module")
def engine() -> Engine:
    """No tokenizer needed: these sessions get their messages and cache without a chat template."""
    return Engine(tiny_qwen3(0), fingerprint="tiny", kv=KVConfig("standard"))


def session_of(engine: Engine, *turns: str, system: str | None = "Be kind.") -> ChatSession:
    session = ChatSession(engine, system)
    for text in turns:
        session.messages += [Message("user", text), Message("assistant", THOUGHT)]
    return session


def fill_cache(session: ChatSession, n: int = 20) -> None:
    """Put ``n`` tokens in the session's cache the way a turn would."""
    for _ in session.engine.generate(list(range(1, n)), session.caches, GenerationParams(max_tokens=1)):
        pass


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def test_save_lists_and_autosaves_under_the_same_id(store, engine):
    session = session_of(engine, "Plan a trip to Lisbon\nwith details")
    info = store.save(session)
    assert (info.title, info.messages, info.model, info.broken) == ("Plan a trip to Lisbon", 2, "tiny", None)
    session.messages += [Message("user", "and Porto?")]
    again = store.save(session)  # autosave: the id the session got the first time
    assert again.id == info.id and again.messages == 3 and again.updated >= info.updated
    assert [i.id for i in store.list()] == [info.id]


def set_updated(path: Path, when: float) -> None:
    """Rewrite a session file's header time (as if it was last saved ``when``), keeping everything else."""
    header = read_header(path)
    header["updated"] = when
    rewrite_header(path, encode_header(header))


def set_updated_in_index(store: SessionStore, session_id: str, when: float) -> None:
    """As if the stored chat was last saved ``when``: its time in the store's index."""
    with sqlite3.connect(store.root / "store.sqlite") as db:
        db.execute("UPDATE chats SET updated = ? WHERE id = ?", (when, session_id))


def test_list_is_newest_first_and_shows_broken_files(store, engine):
    first = store.save(session_of(engine, "first"))
    second = store.save(session_of(engine, "second"))
    # "first" was saved an hour before "second" by its recorded time, though it changed on disk last
    set_updated_in_index(store, first.id, second.updated - 3600)
    (store.root / "broken.mlxchat").write_bytes(b"garbage")
    (store.root / f".{first.id}.mlxchat.123.tmp").write_bytes(b"left by a crash")
    infos = store.list()
    assert [i.id for i in infos if not i.broken] == [second.id, first.id]
    broken = next(i for i in infos if i.broken)
    assert broken.id == "broken" and "not an mlxchat session file" in broken.broken


def test_save_removes_temporary_files_a_crash_left(store, engine):
    info = store.save(session_of(engine, "hello"))
    old, recent = (store.root / f".{info.id}.mlxchat.{pid}.tmp" for pid in (1, 2))
    for temp in (old, recent):
        temp.write_bytes(b"half a file")
    os.utime(old, (time.time() - 2 * 3600,) * 2)
    store.save(session_of(engine, "hello"), info.id)
    assert not old.exists() and recent.exists()  # a recent one may belong to a save in progress


def test_load_restores_and_later_saves_update_the_same_file(store, engine):
    session = session_of(engine, "hello")
    fill_cache(session)
    info = store.save(session)
    loaded = store.load(info.id, engine)
    assert loaded.history == session.history and loaded.caches.tokens == session.caches.tokens
    assert store.save(loaded).id == info.id and len(store.list()) == 1


def test_rename_keeps_everything_else(store, engine):
    session = session_of(engine, "hello")
    fill_cache(session)
    info = store.save(session)
    renamed = store.rename(info.id, "  My   greeting ")
    assert (renamed.title, renamed.updated) == ("My greeting", info.updated)
    loaded = store.load(info.id, engine)
    assert loaded.title == "My greeting" and loaded.caches.tokens == session.caches.tokens


def test_rename_refuses_empty_titles_and_broken_files(store, engine):
    info = store.save(session_of(engine, "hello"))
    with pytest.raises(SessionFileError, match="empty"):
        store.rename(info.id, "  ")
    broken = store.root / "bad.mlxchat"  # a chat file of an earlier version, damaged
    session_of(engine, "hello").save(broken)
    damaged = broken.read_bytes()[:-1]
    broken.write_bytes(damaged)
    with pytest.raises(SessionFileError, match="damaged"):
        store.rename("bad", "new title")
    assert broken.read_bytes() == damaged


def test_delete_and_unknown_ids(store, engine):
    info = store.save(session_of(engine, "bye"))
    store.delete(info.id)
    assert store.list() == [] and not info.path.exists()
    with pytest.raises(SessionNotFoundError, match="no session"):
        store.delete(info.id)
    with pytest.raises(SessionNotFoundError, match="not a session id"):
        store.info("../escape")


def test_search_ignores_case(store, engine):
    lisbon = store.save(session_of(engine, "Trip to LISBON"))
    store.save(session_of(engine, "Recipe for bread"))
    store.rename(lisbon.id, "Lisbon, Portugal")
    assert [i.id for i in store.search("lisbon")] == [lisbon.id]
    assert store.search("nothing like it") == []


def test_export_markdown_of_stored_and_live_sessions(store, engine):
    session = session_of(engine, "Say hello", system="You are kind.\nBe brief.")
    session.title = "Greetings"
    info = store.save(session)
    text = store.export_markdown(info.id)
    assert text.startswith("# Greetings\n") and "Model: tiny" in text
    assert "**System prompt**\n\n> You are kind.\n> Be brief.\n" in text
    assert ("## You\n\nSay hello\n\n## Assistant\n\n<details><summary>Thinking</summary>\n\n"
            "The user greets me.\n\n</details>\n\nHello! How can I help?\n") in text
    live = store.export_markdown(session)
    assert live.split("## You")[1] == text.split("## You")[1]


def test_default_root_follows_the_platform(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home" / "sessions"
    monkeypatch.delenv("MLXCHAT_HOME")
    monkeypatch.setattr(store_module.sys, "platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_root() == tmp_path / "data" / "mlxchat" / "sessions"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_root() == Path.home() / ".local" / "share" / "mlxchat" / "sessions"
    monkeypatch.setattr(store_module.sys, "platform", "darwin")
    assert default_root() == Path.home() / "Library" / "Application Support" / "mlxchat" / "sessions"


# --- the CLI --------------------------------------------------------------------------------------

def cli(store: SessionStore, *argv: str) -> int:
    parser = argparse.ArgumentParser(prog="mlxchat")
    add_sessions_parser(parser.add_subparsers(dest="command"))
    return run_sessions(parser.parse_args(["sessions", "--store", str(store.root), *argv]))


def test_cli_ls_show_rename_export_rm(store, engine, capsys, tmp_path):
    assert cli(store, "ls") == 0 and "No saved sessions" in capsys.readouterr().out
    info = store.save(session_of(engine, "Plan a picnic"))
    store.close()  # the window that saved it quits: the CLI may change it now
    assert cli(store, "ls") == 0 and f"{info.id}" in (out := capsys.readouterr().out) and "Plan a picnic" in out
    assert cli(store, "show", info.id) == 0 and "## Assistant" in capsys.readouterr().out
    assert cli(store, "rename", info.id, "Picnic") == 0 and "Picnic" in capsys.readouterr().out
    assert cli(store, "ls", "picn") == 0 and "Picnic" in capsys.readouterr().out
    target = tmp_path / "picnic.md"
    assert cli(store, "export", info.id, "-o", str(target)) == 0
    assert target.read_text().startswith("# Picnic\n")
    assert cli(store, "rm", info.id) == 0 and store.list() == []


def test_cli_errors_are_one_line_mlxchat_errors(store):
    with pytest.raises(MlxchatError, match="no session 'nope'"):
        cli(store, "show", "nope")
