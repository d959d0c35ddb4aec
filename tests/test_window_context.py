"""The window's status line shows the context that fits: what the KV memory holds for one chat, not only what
the model was trained for (an 8 GB Mac's pair leaves a few thousand tokens of its 40,960)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine_host import protocol as p
from app.engine_host.server import EngineServer
from engine_host_helpers import RecordingChannel


def test_a_reply_reports_the_context_its_kv_memory_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    channel = RecordingChannel()
    server = EngineServer(channel)
    server.handle(p.Open(model="mini-target", no_draft=True, think=False, max_kv=300))
    server.handle(p.Send("What is 12 + 7?"))
    while server.replies.stepping:
        server.replies.advance()
    done = [event for event in channel.sent if isinstance(event, p.Done)][-1]
    engine = server.model.engine
    fits = engine.token_limit()
    assert fits is not None and fits < engine.context_length, "the KV memory holds less than the model's context"
    assert done.stats["context_length"] == fits
