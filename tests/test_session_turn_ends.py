"""How a ChatSession turn ends early: refused, stopped during prefill, or failed before its first token.

A refused turn leaves the history as it was; a turn with no token adds no assistant
message; either way the session goes on, and its next turn answers exactly as the
same history computed from scratch does.
"""

from __future__ import annotations

import pytest

from mlxcore.errors import PromptError
from mlxcore.events import TokenEvent
from mlxcore.params import GenerationParams
from mlxcore.prefill import StopPrefill
from session_kill_helper import tiny_engine
from sessions.chat_session import ChatSession
from sessions.messages import Message
from turn_checks import send_matching_a_cold_run

GREEDY = GenerationParams(temperature=0.0, max_tokens=12, prefill_chunk=8)
CONTEXT = 160  # tokens: a short context makes "too long" cheap to reach


@pytest.fixture
def engine():
    engine = tiny_engine("paged")
    engine.context_length = CONTEXT
    return engine


def chat(engine, turns: int = 1) -> ChatSession:
    session = ChatSession(engine, "Be brief.", GREEDY)
    for n in range(turns):
        session.send(f"Question {n}?")
    return session


def next_turn_matches_a_cold_run(session: ChatSession) -> None:
    send_matching_a_cold_run(session, "And then?")


def test_a_too_long_message_is_not_kept(engine):
    session = chat(engine)
    before = list(session.history)
    with pytest.raises(PromptError, match="tokens"):
        session.send("word " * CONTEXT)
    assert session.history == before
    next_turn_matches_a_cold_run(session)


def test_a_too_long_edit_leaves_the_message_and_reply_it_replaced(engine):
    session = chat(engine, turns=2)
    before = list(session.history)
    with pytest.raises(PromptError):
        session.edit_last_user("word " * CONTEXT)
    assert session.history == before
    next_turn_matches_a_cold_run(session)


def test_a_stop_during_prefill_adds_no_reply(engine):
    session = chat(engine)
    seen = []

    def stop_after_two_chunks(done: int, total: int) -> None:
        seen.append(done)
        if len(seen) == 3:
            raise StopPrefill
    session.prefill_progress = stop_after_two_chunks
    text = "Please read this: " + "alpha beta gamma " * 8
    assert list(session.stream(text)) == []
    session.prefill_progress = None
    assert session.history[-1] == Message("user", text), "the message stays, with no reply yet"
    assert session.last_stats is None, "no figures for a reply that did not start"
    assert seen[:3] == [0, 8, 16], "the stop came between chunks"
    assert len(session.caches.tokens) < len(session.prompt_ids()) - 1
    next_turn_matches_a_cold_run(session)


def test_an_error_before_the_first_token_adds_no_reply(engine):
    session = chat(engine)

    def fail(done: int, total: int) -> None:
        if done:
            raise RuntimeError("boom")
    session.prefill_progress = fail
    with pytest.raises(RuntimeError, match="boom"):
        session.send("Please read this: " + "alpha beta gamma " * 8)
    session.prefill_progress = None
    assert session.history[-1].role == "user"
    next_turn_matches_a_cold_run(session)


def test_a_reply_stopped_after_its_first_token_is_kept(engine):
    """Stored as its token spells it (the streamed text may lack a leading space: mlx-lm's detokenizer)."""
    session = chat(engine)
    events = session.stream_events("Tell me more.")
    first = next(e for e in events if isinstance(e, TokenEvent))
    events.close()
    assert session.history[-1] == Message("assistant", engine.tokenizer.decode([first.token]))
    assert session.history[-1].content.strip() == first.text.strip()
