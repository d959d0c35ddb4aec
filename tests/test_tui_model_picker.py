"""The window's model switch (F5): a picker that lists what `mlxchat models` lists, the current model marked,
and takes a typed reference too; Enter loads the choice and the chat goes on with it, Escape keeps the model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import Input, OptionList

from app.catalog import ModelEntry
from app.tui.app import ChatApp
from app.tui.screens.model_picker import CURRENT_MARK, ModelPicker
from assets import MODELS_DIR
from mlxcore.configs import ModelChoice
from test_tui_helpers import SIZE, open_command, send, wait_for, wait_ready

NEWNAME = "my-model"  # the embedded target's files in a --models-dir
ENTRIES = [ModelEntry("local", ModelChoice("/models/local"), "models-dir", Path("/models/local")),
           ModelEntry("org/cached", ModelChoice("org/cached"), "hf-cache", Path("/hub/snapshot")),
           ModelEntry("mini-target", ModelChoice("mini-target"), "embedded", MODELS_DIR / "mini-target")]


class PickerHost(App[None]):
    """Only the picker, as the chat window pushes it."""

    def __init__(self, current: str | None) -> None:
        super().__init__()
        self.picker = ModelPicker(lambda: list(ENTRIES), current)
        self.chosen: str | None = "not closed"

    def on_mount(self) -> None:
        self.push_screen(self.picker, self._picked)

    def _picked(self, ref: str | None) -> None:
        self.chosen = ref


def pick(current: str | None, *keys: str, typed: str | None = None) -> tuple[str | None, list[str]]:
    """What the picker dismisses with after ``keys`` (or ``typed`` and Enter), and the lines it listed."""
    async def scenario():
        app = PickerHost(current)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.picker.entries, what="the listing")
            options = app.picker.query_one(OptionList)
            lines = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
            if typed is not None:
                app.picker.query_one(Input).focus()
                await pilot.press(*typed, "enter")
            await pilot.press(*keys)
            await pilot.pause()
            return app.chosen, lines
    return asyncio.run(scenario())


def test_the_current_model_is_marked_and_enter_keeps_it():
    chosen, lines = pick("org/cached", "enter")
    assert chosen == "org/cached"
    assert lines == ["  local  (models-dir)", f"{CURRENT_MARK}org/cached  (hf-cache)", "  mini-target  (embedded)"]


def test_a_models_dir_entry_loads_its_folder():
    assert pick("mini-target", "home", "enter")[0] == "/models/local"
    assert pick("/models/local", "down", "enter")[0] == "org/cached", "a folder path marks its entry"


def test_a_typed_reference_loads_as_typed_and_a_listed_name_as_listed():
    assert pick(None, typed="someone/other")[0] == "someone/other"
    assert pick(None, typed="local")[0] == "/models/local"


def test_escape_keeps_the_model():
    assert pick("mini-target", "escape")[0] is None


@pytest.fixture
def models_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # the user's cache stays out of the list
    folder = tmp_path / "models"
    (folder / NEWNAME).mkdir(parents=True)
    for file in (MODELS_DIR / "mini-target").iterdir():
        (folder / NEWNAME / file.name).symlink_to(file)
    return folder


@pytest.mark.slow
def test_f5_lists_the_models_dir_and_the_chat_goes_on_with_the_model_picked(models_dir):
    async def scenario():
        app = ChatApp(open_command(max_tokens=16), models_dir=models_dir)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "What is 12 + 7?")
            before = app.status.model
            await pilot.press("f5")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker) and app.screen.entries,
                           what="the model list")
            listed = [(entry.id, entry.source) for entry in app.screen.entries]
            await pilot.press("f5")
            pickers = sum(isinstance(screen, ModelPicker) for screen in app.screen_stack)
            await pilot.press("home", "enter")
            # (a model picked alone drafts by prompt lookup: the header says so)
            await wait_for(pilot, lambda: app.ready and app.status.model == f"{NEWNAME} + lookup",
                           what="the model switch")
            await send(pilot, app, "And 3 + 4?")
            return before, listed, pickers, app.state.messages
    before, listed, pickers, messages = asyncio.run(scenario())
    assert before == "mini-target + mini-draft"
    assert listed[0] == (NEWNAME, "models-dir") and ("mini-target", "embedded") in listed
    assert pickers == 1, "F5 again while the picker is open opens no second one"
    assert [role for role, _ in messages] == ["user", "assistant", "user", "assistant"], "the chat went on"
    assert messages[-1][1].strip(), "the new model answered"
