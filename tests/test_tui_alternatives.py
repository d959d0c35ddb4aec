"""Replies side by side in the chat window (f7), its engine in a child process as users run it: the replies
stream into their columns, the one the user keeps becomes the chat's reply (saved, and the next turn on its
cache answers as a cold run does), Escape stops them and leaves what they have to pick from."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.engine_host.protocol import Chunk
from app.tui.screens.dialogs import ErrorDialog
from app.tui.screens.settings import SettingsScreen
from app.tui.text_parts import split_reply
from app.tui.widgets.alternatives import AlternativesView
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from sessions.store import SUFFIX, SessionStore
from test_tui_helpers import (DRAFT, SIZE, TARGET, EventGate, make_app, send, send_every_token, settle, wait_for,
                               wait_ready)
from turn_checks import send_matching_a_cold_run

pytestmark = pytest.mark.slow
SAMPLED = {"temperature": 0.8, "seed": 7}  # each reply draws with its own seed (7, 8, 9)
STORY = "Tell me a story about a cat."


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))


def stored(file: str) -> tuple[SessionStore, str]:
    """The store and id of the chat saved at ``file`` (a store chat's address, ``SessionStore.path_for``)."""
    address = Path(file)
    return SessionStore(address.parent), address.name.removesuffix(SUFFIX)


def shown(view) -> tuple[str, str]:
    return view.thinking.strip(), view.answer.strip()


def record_chunks(app) -> list[Chunk]:
    chunks: list[Chunk] = []
    original = app._engine_chunk

    async def recording(event: Chunk) -> None:
        chunks.append(event)
        await original(event)
    app._engine_chunk = recording
    return chunks


def test_three_replies_stream_side_by_side_and_the_one_kept_is_the_chats_reply(monkeypatch):
    send_every_token(monkeypatch)
    async def scenario():
        app = make_app(max_tokens=40, params=SAMPLED)
        chunks = record_chunks(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await pilot.press("f10")  # how many replies: the settings
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen)
                           and bool(app.screen.query("#set-alternatives")), what="the settings")
            app.screen.query_one("#set-alternatives").value = "3"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.alternatives_count == 3, what="the setting")
            app.prompt.load_text(STORY)
            await pilot.press("f7")
            await wait_for(pilot, lambda: app.picking == 3, what="three replies to pick from")
            columns = [shown(column.view) for column in app.chat.alternatives.columns]
            palette = {command.title for command in app.get_system_commands(app.screen)}
            await pilot.press("2")  # the columns have focus
            await settle(pilot, app, 1)
            return chunks, columns, palette, app.state, len(app.query(AlternativesView))
    chunks, columns, palette, state, views = asyncio.run(scenario())
    for choice in range(3):
        mine = [c for c in chunks if c.choice == choice]
        assert len(mine) > 2, f"reply {choice + 1} streamed piece by piece"
        text = split_reply("".join(c.raw for c in mine))
        assert (text[0].strip(), text[1].strip()) == columns[choice], "each column shows its own reply"
    assert {"Keep reply 1", "Keep reply 2", "Keep reply 3"} <= palette
    assert state.messages[0] == ("user", STORY) and len(state.messages) == 2 and views == 0
    assert shown_parts(state.messages[1][1]) == columns[1], "the reply kept is the second column's"
    store, chat = stored(state.file)
    assert [(m.role, m.content) for m in store.read(chat).history] == list(state.messages), "saved after the pick"
    engine = open_engine(ModelChoice(TARGET, DRAFT)).engine
    session = store.load(chat, engine)
    session.params = GenerationParams(temperature=0.0, max_tokens=24)
    send_matching_a_cold_run(session, "And then what happened?")  # the kept reply's cache serves the next turn


async def click_until_picked(pilot, view: AlternativesView, button: str) -> None:
    """Click ``button``; if the view did not take the pick, pick with its key (1-n) instead. In a few full-suite
    runs the click never reached the button (something covered it there); the key reaches the view."""
    await pilot.click(button)
    try:
        await wait_for(pilot, lambda: view.picked, timeout=5.0, what="the pick")
    except AssertionError:
        view.focus()
        await pilot.press(button.removeprefix("#keep-"))
        await wait_for(pilot, lambda: view.picked, timeout=10.0, what="the pick by its key")


def shown_parts(content: str) -> tuple[str, str]:
    thinking, answer = split_reply(content)
    return thinking.strip(), answer.strip()


def test_escape_stops_the_replies_and_what_they_have_stays_to_pick(monkeypatch):
    """The gate holds the UI once both replies have text: the engine is still writing when Escape comes."""
    send_every_token(monkeypatch)
    async def scenario():
        app = make_app(max_tokens=3000, ignore_eos=True, params=SAMPLED)
        gate = EventGate(app, hold_after=lambda events: {e.choice for e in events if isinstance(e, Chunk)
                                                         and e.answer + e.thinking} == {0, 1})
        async with app.run_test(size=SIZE) as pilot:
            try:
                await wait_ready(pilot, app)
                app.prompt.load_text(STORY)
                await pilot.press("f7")
                await wait_for(pilot, gate.holding.is_set, what="text in both replies")
                await pilot.press("escape")
            finally:
                gate.release()
            await wait_for(pilot, lambda: app.picking == 2, what="the stopped replies to pick from")
            view = app.chat.alternatives
            ends = [column.ended for column in view.columns]
            columns = [shown(column.view) for column in view.columns]
            await click_until_picked(pilot, view, "#keep-1")
            await settle(pilot, app, 1)
            return ends, columns, app.state, app.status.stats
    ends, columns, state, stats = asyncio.run(scenario())
    assert ends == ["stopped", "stopped"]
    assert all(answer or thinking for thinking, answer in columns), "each reply keeps what it had"
    assert shown_parts(state.messages[-1][1]) == columns[0], "the reply clicked is kept"
    assert stats["finish_reason"] == "stopped" and 0 < stats["generated_tokens"] < 3000
    store, chat = stored(state.file)
    assert [(m.role, m.content) for m in store.read(chat).history] == list(state.messages)


def test_replies_side_by_side_in_place_of_the_last_reply():
    """f7 with nothing typed: the last reply is replaced by the one kept of n new ones."""
    async def scenario():
        app = make_app(max_tokens=24, params=SAMPLED)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            app.prompt.load_text(STORY)
            await pilot.press("enter")
            await settle(pilot, app, 1)
            first = app.state.messages
            await pilot.press("f7")
            await wait_for(pilot, lambda: app.picking == 2, what="two replies to pick from")
            kept = shown(app.chat.alternatives.columns[1].view)
            app.action_pick(2)  # as the palette's "Keep reply 2" does
            await settle(pilot, app, 2)
            return first, kept, app.state.messages
    first, kept, after = asyncio.run(scenario())
    assert [m[0] for m in after] == ["user", "assistant"] and after[0] == first[0]
    assert shown_parts(after[1][1]) == kept


def test_a_session_on_a_rotating_cache_says_replies_side_by_side_need_paged():
    async def scenario():
        app = make_app(kv="rotating", max_kv=1024, max_tokens=8, params=SAMPLED)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            app.prompt.load_text(STORY)
            await pilot.press("f7")
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the refusal")
            refusal = (app.screen.title_text, app.screen.message, app.prompt.text, app.generating)
            await pilot.press("escape")
            await pilot.press("enter")  # the message came back to the input: one reply works, as it always did
            await settle(pilot, app, 2)
            return refusal, app.state.messages
    (title, message, returned, generating), messages = asyncio.run(scenario())
    assert title == "Replies side by side need --kv paged" and "Enter" in message
    assert returned == STORY and not generating
    assert messages == (("user", STORY), messages[1]) and messages[1][0] == "assistant"


def test_settings_refuse_a_number_of_replies_that_does_not_fit():
    async def scenario():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await pilot.press("f10")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen)
                           and bool(app.screen.query("#set-alternatives")), what="the settings")
            app.screen.query_one("#set-alternatives").value = "9"
            await pilot.press("ctrl+s")
            await pilot.pause()
            return str(app.screen.query_one("#settings-error").render()), app.alternatives_count
    error, count = asyncio.run(scenario())
    assert "2 to 4" in error and count == 2



def test_the_window_runs_its_chats_with_8_bit_kv_when_asked():
    async def scenario():
        app = make_app(kv_bits=8, max_tokens=16)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "Name a colour.")
            return app.state.messages[-1], app.status.stats
    (role, reply), stats = asyncio.run(scenario())
    assert role == "assistant" and reply
    float_bytes_per_token = 6 * 2 * 2 * 32 * 4  # the embedded target: 6 layers, 2 kv heads of 32, float32
    assert 0 < stats["kv_bytes"] < 256 * 16 * float_bytes_per_token, "8-bit slabs: a third of the float ones"
