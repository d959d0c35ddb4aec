"""SteadyMarkdown lays out like Textual's Markdown, with fewer layout passes while a paragraph grows."""

from __future__ import annotations

import asyncio

from textual.app import App
from textual.containers import Horizontal
from textual.widgets import Markdown

from app.tui.widgets.steady_markdown import SteadyMarkdown

WORDS = ("The quick brown fox jumps over the lazy dog while the cat watches from the warm window sill "
         "and the bird sings a long song about rain").split()


class SideBySide(App):
    CSS = "Markdown { width: 30; height: auto; }"

    def compose(self):
        with Horizontal():
            yield Markdown(id="plain")
            yield SteadyMarkdown(id="steady")


def test_growing_paragraph_matches_markdown_and_skips_layouts():
    async def scenario():
        app = SideBySide()
        layouts = 0
        async with app.run_test(size=(80, 30)) as pilot:
            plain, steady = app.query_one("#plain", Markdown), app.query_one("#steady", SteadyMarkdown)
            screen = app.screen
            original = screen._refresh_layout

            def counting(*args, **kwargs):
                nonlocal layouts
                layouts += 1
                return original(*args, **kwargs)
            screen._refresh_layout = counting
            steady_heights, plain_heights, counts = [], [], []
            for word in WORDS:  # the steady one alone first, so only its layout passes are counted
                before = layouts
                await steady.append(word + " ")
                await pilot.pause()
                await pilot.pause()
                steady_heights.append(steady.size.height)
                counts.append(layouts - before)
            for word in WORDS:
                await plain.append(word + " ")
                await pilot.pause()
                await pilot.pause()
                plain_heights.append(plain.size.height)
            return list(zip(plain_heights, steady_heights, counts))
    heights = asyncio.run(scenario())
    assert all(p == s for p, s, _ in heights), heights  # same height after every word
    grew = [b != a for (a, _, _), (b, _, _) in zip(heights, heights[1:])]
    assert sum(grew) >= 3  # the paragraph wrapped onto new lines along the way
    # layout passes only when the height changed (and for the first word, which mounts the paragraph)
    assert all(n == 0 for changed, (_, _, n) in zip(grew, heights[1:]) if not changed)
    assert all(n > 0 for changed, (_, _, n) in zip(grew, heights[1:]) if changed)
