"""MLX's buffer cache stays small, as mlx-lm keeps it, with Metal's cache policy reproduced on the CPU backend.

On Linux MLX caps its cache at 32 MB, so nothing here would show what a Mac holds: each test raises the cap to
Metal's (about the whole working set; ``mx.set_cache_limit(2**40)`` is beyond any) and measures what is held.
Without the clears, a 12-turn chat of the embedded pair leaves 57 MB cached and a model switch the old model's
weights; with them, what one step frees (4 to 12 MB) at any time, under 1 MB between turns and nothing after a
switch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mlxcore  # noqa: F401  (before mlx.core)
import mlx.core as mx
import pytest

from mlxcore import ModelChoice, open_engine
from sessions.chat_session import ChatSession

METAL_CAP = 2**40


@pytest.fixture
def metal_policy() -> Iterator[None]:
    previous = mx.set_cache_limit(METAL_CAP)
    try:
        yield
    finally:
        mx.set_cache_limit(previous)
        mx.clear_cache()


def test_engine_start_caps_the_cache(metal_policy: None):
    open_engine(ModelChoice(model="mini-target", no_draft=True))
    assert mx.set_cache_limit(METAL_CAP) <= 2**30


def test_the_cache_stays_bounded_across_a_long_chat(metal_policy: None):
    chat = ChatSession(open_engine(ModelChoice(model="mini-target", draft="mini-draft")).engine)
    mx.set_cache_limit(METAL_CAP)  # the engine's own cap off: only the clears keep it small
    peak = 0
    for turn in range(12):
        for _ in chat.stream(f"What is {turn} + {turn * 7}? Then reverse the word python{turn}."):
            peak = max(peak, mx.get_cache_memory())
        assert mx.get_cache_memory() < 2**20, f"turn {turn}: the idle engine keeps its buffers cached"
    assert peak < 32 * 2**20, f"{peak / 2**20:.1f} MiB cached at once"  # (Linux's own cap; 57 MB without clears)


def test_a_model_switch_leaves_nothing_of_the_old_model_cached(metal_policy: None, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    from app.engine_host import protocol as p
    from app.engine_host.server import EngineServer
    from engine_host_helpers import RecordingChannel

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    channel = RecordingChannel()
    server = EngineServer(channel)
    server.handle(p.Open(model="mini-target", no_draft=True, think=False))
    server.handle(p.Send("What is 12 + 7?"))
    while server.replies.stepping:
        server.replies.advance()
    mx.set_cache_limit(METAL_CAP)
    server.handle(p.Open(model="mini-draft", no_draft=True))  # F5
    assert [type(e).__name__ for e in channel.sent if isinstance(e, p.Failure)] == []
    assert server.model.engine.model_name == "mini-draft"
    assert mx.get_cache_memory() == 0, f"{mx.get_cache_memory():,} bytes of the old model still cached"
