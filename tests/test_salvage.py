"""Writing a chat's history into its file without the engine (the UI does it when the engine died)."""

from __future__ import annotations

import pytest

from sessions.chat_session import ChatSession
from sessions.errors import SessionFileError
from sessions.file_format import read_header
from sessions.salvage import save_history
from session_kill_helper import tiny_engine
from mlxcore.params import GenerationParams


@pytest.fixture
def saved(tmp_path):
    engine = tiny_engine("paged")
    session = ChatSession(engine, "Be brief.", GenerationParams(max_tokens=8))
    session.send("Hello?")
    path = tmp_path / "chat.mlxchat"
    session.save(path)
    return engine, session, path


def test_the_history_changes_and_the_cache_stays(saved):
    engine, session, path = saved
    shown = [(m.role, m.content) for m in session.history[1:]] + [("user", "More?"), ("assistant", "Part of a")]
    assert save_history(path, shown) is True
    reopened = ChatSession.load(path, engine)
    assert [(m.role, m.content) for m in reopened.history[1:]] == shown
    assert reopened.system == "Be brief."
    assert reopened.caches.tokens == session.caches.tokens, "the saved cache is kept as it was"
    assert save_history(path, shown) is False, "nothing to write the second time"


def test_a_damaged_file_is_not_rewritten(saved):
    _, session, path = saved
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # a byte of the first cache block
    path.write_bytes(bytes(data))
    with pytest.raises(SessionFileError, match="damaged"):
        save_history(path, [("user", "x")])
    assert path.read_bytes() == bytes(data), "left as it was, not given a fresh checksum"
    assert len(list(path.parent.iterdir())) == 1, "no temporary file left behind"
    assert read_header(path)["history"][0]["content"] == "Hello?"
