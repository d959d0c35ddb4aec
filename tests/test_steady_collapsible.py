"""SteadyCollapsible: its title shows every change, and re-lays out the screen only when its width changes."""

from __future__ import annotations

import asyncio

from textual.app import App
from textual.widgets import Collapsible, Label

from app.tui.widgets.steady_collapsible import SteadyCollapsible

TITLES = ["Thinking… 7 words", "Thinking… 8 words", "Thinking… 9 words", "Thinking… 10 words",
          "Thinking… 11 words", "Thought for 11 words"]


class TwoBlocks(App):
    def compose(self):
        yield Collapsible(Label("x"), title="Thinking…", id="plain")
        yield SteadyCollapsible(Label("x"), title="Thinking…", id="steady")


def retitle(block_id: str):
    """Set each of TITLES on one block; rows of (title shown, title width, layout passes it caused)."""
    async def scenario():
        app = TwoBlocks()
        async with app.run_test(size=(60, 12)) as pilot:
            block = app.query_one(f"#{block_id}", Collapsible)
            screen, passes = app.screen, [0]
            original = screen._refresh_layout

            def counting(*args, **kwargs):
                passes[0] += 1
                return original(*args, **kwargs)
            screen._refresh_layout = counting
            await pilot.pause()
            rows = []
            for title in TITLES:
                before = passes[0]
                block.title = title
                await pilot.pause()
                await pilot.pause()
                shown = block.query_one("CollapsibleTitle")
                rows.append((str(shown.render()), shown.size.width, passes[0] - before))
            return rows
    return asyncio.run(scenario())


def test_title_changes_show_and_lay_out_only_when_the_width_changes():
    plain, steady = retitle("plain"), retitle("steady")
    assert [(text, width) for text, width, _ in steady] == [(text, width) for text, width, _ in plain]
    assert all(title in text for title, (text, _, _) in zip(TITLES, steady))
    assert all(n > 0 for _, _, n in plain), plain  # Textual's own title lays out on every change
    widths = [len("▶ Thinking…")] + [width for _, width, _ in steady]
    for (before, after), (_, _, n) in zip(zip(widths, widths[1:]), steady):
        assert (n > 0) == (before != after), steady
