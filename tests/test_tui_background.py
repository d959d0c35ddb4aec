"""Chats that answer in the background, in the chat window with its engine in a child process: a reply goes on
while the user opens another chat and asks there, both replies end and are saved, each equal to the same turn
run alone (greedy); Escape stops the chat on screen only; a chat opened again shows its reply as far as it got.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.engine_host import protocol as p
from app.tui.text_parts import split_reply
from app.tui.widgets.message_view import MessageView
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from sessions.store import SUFFIX, SessionStore
from test_tui_helpers import DRAFT, SIZE, TARGET, make_app, settle, wait_for, wait_ready

pytestmark = pytest.mark.slow
FIRST, SECOND = "Tell me a long story.", "What is 12 + 7?"


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))


def record_generating(app) -> list[tuple[p.Generating, dict[str, str]]]:
    """Every Generating event the window got (which chats were answering, in order), with what the sidebar
    said of each of those chats once it had the event."""
    seen: list[tuple[p.Generating, dict[str, str]]] = []
    original = app._engine_generating

    async def recording(event: p.Generating) -> None:
        await original(event)
        listing = app.query_one("#session-list")
        ids = {listing.get_option_at_index(i).id for i in range(listing.option_count)}
        seen.append((event, {sid: str(listing.get_option(sid).prompt) for sid in event.session_ids if sid in ids}))
    app._engine_generating = recording
    return seen


def saved(file: str) -> list[tuple[str, str]]:
    address = Path(file)
    return [(m.role, m.content) for m in SessionStore(address.parent).read(address.name.removesuffix(SUFFIX)).history]


def alone(turns: list[tuple[str, int]]) -> list[list[tuple[str, str]]]:
    """Each (text, max tokens) turn run alone in a chat of its own (``ChatSession.send``, speculative with
    the draft), end-of-text ignored as in the app: each chat's history."""
    engine = open_engine(ModelChoice(TARGET, DRAFT)).engine
    engine.eos_ids = set()
    chats = []
    for text, max_tokens in turns:
        session = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=max_tokens))
        session.send(text)
        chats.append([(m.role, m.content) for m in session.history])
        session.caches.release()
    return chats


async def ask_in_a_new_chat(pilot, app, text: str, max_tokens: int) -> None:
    """ctrl+n while the chat on screen answers, then ``text`` in the new chat (with its own reply length).

    Nothing waits for the engine between the first chat's Enter and ctrl+n: it takes commands one at a
    time between steps, so the first reply has a few tokens, not more, when the second one starts.
    """
    await pilot.press("ctrl+n")
    app.client.send(p.Configure(params={"max_tokens": max_tokens}))  # the new chat's (commands keep their order)
    await wait_for(pilot, lambda: app.state.session_id is None and not app.generating
                   and app.state.params["max_tokens"] == max_tokens, what="the new chat")
    app.prompt.load_text(text)
    await pilot.press("enter")


def test_a_chat_answers_in_the_background_while_another_asks():
    async def scenario():
        app = make_app(max_tokens=400, ignore_eos=True)
        seen = record_generating(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            app.prompt.load_text(FIRST)
            await pilot.press("enter")
            await ask_in_a_new_chat(pilot, app, SECOND, 48)
            await settle(pilot, app, 1)
            second = app.state
            first = next(sid for event, _ in seen for sid in event.session_ids if sid != second.session_id)
            await wait_for(pilot, lambda: not app.answering, what="the first chat to finish")
            await pilot.press("ctrl+b", "ctrl+b")  # focuses the sessions list
            listing = app.query_one("#session-list")
            listing.highlighted = listing.get_option_index(first)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.state.session_id == first, what="the first chat again")
            shown = [view.content for view in app.query(MessageView)]
            return seen, first, second, app.state, shown
    seen, first, second, back, shown = asyncio.run(scenario())
    both = [marks for event, marks in seen if set(event.session_ids) == {first, second.session_id}]
    assert both, "both chats were generating at once"
    assert "answering" in both[0][first], "the sidebar marks the chat answering in the background"
    first_alone, second_alone = alone([(FIRST, 400), (SECOND, 48)])
    assert saved(second.file) == list(second.messages) == second_alone
    assert saved(back.file) == list(back.messages) == first_alone, \
        "the background reply ended as the same turn alone does, and was saved"
    assert len(shown) == 2 and not back.turn


def test_escape_stops_only_the_chat_on_screen_and_a_chat_comes_back_streaming():
    async def scenario():
        app = make_app(max_tokens=4000, ignore_eos=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            app.prompt.load_text(FIRST)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.turn and app.state.session_id, what="the first reply to start")
            first = app.state.session_id
            await ask_in_a_new_chat(pilot, app, SECOND, 4000)
            await wait_for(pilot, lambda: app.chat.live is not None and app.chat.live.content, what="the 2nd reply")
            await pilot.press("escape")
            await settle(pilot, app, 1)
            stopped = (app.status.stats, app.state, app.answering)
            app.client.send(p.OpenSession(first))  # as the sidebar does
            await wait_for(pilot, lambda: app.state.session_id == first and app.chat.live is not None
                           and app.chat.live.content, what="the first chat, streaming")
            on_return = (app.generating, len(app.chat.live.content))
            await wait_for(pilot, lambda: len(app.chat.live.content) > on_return[1], what="more text")
            await pilot.press("escape")
            await settle(pilot, app, 2)
            view = app.chat.views[-1]
            return stopped, on_return, app.state, (view.thinking.strip(), view.answer.strip()), app.answering
    (stats, second, answering), (generating, _), first, shown, after = asyncio.run(scenario())
    assert stats["finish_reason"] == "stopped" and stats["generated_tokens"] < 4000
    assert answering == (first.session_id,), "the chat in the background went on"
    assert saved(second.file) == list(second.messages) and second.messages[-1][0] == "assistant"
    assert generating, "the chat opened again was still answering, and streamed on"
    assert first.messages[-1][0] == "assistant" and after == ()
    assert saved(first.file) == list(first.messages)
    thinking, answer = split_reply(first.messages[-1][1])
    assert shown == (thinking.strip(), answer.strip()) != ("", ""), "the screen shows the whole reply kept"
