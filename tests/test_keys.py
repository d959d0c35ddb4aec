"""Every action of the window is reachable without an F-key, on a key Terminal.app and iTerm2 pass to the app.

A Mac laptop's top row sends media keys unless fn is held; Terminal.app keeps PageUp/PageDown and Home/End, and
Ctrl+arrows belong to Mission Control. The test types each action's other key as the terminal sends it (its
bytes), reads it back through Textual's parser, and checks that help and README list it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual import events
from textual._xterm_parser import XTermParser

from app.tui.commands import ACTIONS, bindings, key_label
from app.tui.screens.help import _keys

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
MAC_TAKES = re.compile(r"^(f\d+|.*\+?(up|down|left|right|pageup|pagedown|home|end))$")
SPECIAL = {"backslash": "\x1c", "right_square_bracket": "\x1d", "underscore": "\x1f"}


def sent_bytes(key: str) -> str | None:
    """What a terminal sends for ``key`` without the kitty protocol (Option as Meta for alt); None if not typed so."""
    if key == "escape":
        return "\x1b"
    modifier, _, name = key.rpartition("+")
    if modifier == "ctrl" and len(name) == 1:
        return chr(ord(name) & 0x1F)
    if modifier == "ctrl" and name in SPECIAL:
        return SPECIAL[name]
    if modifier == "alt" and len(name) == 1:
        return "\x1b" + name
    return None


def parsed(data: str) -> list[str]:
    parser = XTermParser()
    found = list(parser.feed(data)) + list(parser.feed(""))
    return [event.key for event in found if isinstance(event, events.Key)]


@pytest.mark.parametrize("action", ACTIONS, ids=[a.action for a in ACTIONS])
def test_each_action_has_a_key_a_mac_terminal_passes_through(action):
    reachable = [key for key in action.key.split(",") if not MAC_TAKES.match(key) and sent_bytes(key)]
    assert reachable, f"{action.action} has only {action.key}"
    for key in reachable:
        assert parsed(sent_bytes(key)) == [key], f"{key} does not arrive as itself"
        assert key_label(key) in README, f"README does not list {key_label(key)} ({action.title})"
        assert key_label(key).lower() in _keys(action.key)


def test_no_key_does_two_things():
    keys = [key for binding in bindings() for key in binding.key.split(",")]
    assert len(keys) == len(set(keys))
