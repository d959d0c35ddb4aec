"""SteadyMarkdown lays out like Textual's Markdown, with fewer layout passes while a paragraph grows."""

from __future__ import annotations

import asyncio

from textual.app import App
from textual.containers import Horizontal
from textual.widgets import Markdown

from app.tui.widgets.steady_markdown import GROW_LINES, SteadyMarkdown

WORDS = ("The quick brown fox jumps over the lazy dog while the cat watches from the warm window sill "
         "and the bird sings a long song about rain").split() * 2  # long enough for two steps of GROW_LINES


class SideBySide(App):
    CSS = "Markdown { width: 30; height: auto; }"

    def compose(self):
        with Horizontal():
            yield Markdown(id="plain")
            yield SteadyMarkdown(id="steady")


def grow_word_by_word(growing: bool, after=None):
    """Append WORDS one by one to both Markdowns; rows of (Textual's height, steady height, layout passes).

    Heights are of the first paragraph; ``after(app, pilot)`` runs at the end and its result is returned too.
    """
    async def scenario():
        app = SideBySide()
        layouts = 0
        async with app.run_test(size=(80, 30)) as pilot:
            plain, steady = app.query_one("#plain", Markdown), app.query_one("#steady", SteadyMarkdown)
            steady.growing = growing
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
                steady_heights.append(steady.children[0].size.height)
                counts.append(layouts - before)
            for word in WORDS:
                await plain.append(word + " ")
                await pilot.pause()
                await pilot.pause()
                plain_heights.append(plain.children[0].size.height)
            rows = list(zip(plain_heights, steady_heights, counts))
            return rows, (await after(app, pilot) if after else None)
    return asyncio.run(scenario())


def assert_layouts_only_on_height_change(rows):
    steady = [s for _, s, _ in rows]
    changed = [b != a for a, b in zip(steady, steady[1:])]
    assert sum(changed) >= 1, steady
    # a layout pass only when the height changed (and for the first word, which mounts the paragraph)
    assert all(n == 0 for grew, (_, _, n) in zip(changed, rows[1:]) if not grew), rows
    assert all(n > 0 for grew, (_, _, n) in zip(changed, rows[1:]) if grew), rows


def test_growing_paragraph_matches_markdown_and_skips_layouts():
    rows, _ = grow_word_by_word(growing=False)
    assert all(p == s for p, s, _ in rows), rows  # same height after every word
    assert sum(b != a for (a, _, _), (b, _, _) in zip(rows, rows[1:])) >= 3  # it wrapped along the way
    assert_layouts_only_on_height_change(rows)


def test_while_growing_the_last_paragraph_claims_lines_in_steps():
    async def finish_and_start_another(app, pilot):
        plain, steady = app.query_one("#plain", Markdown), app.query_one("#steady", SteadyMarkdown)
        for markdown in (plain, steady):
            await markdown.append("\n\nA second paragraph.")
        await pilot.pause()
        await pilot.pause()
        mid = [(p.size.height, s.size.height) for p, s in zip(plain.children, steady.children)]
        steady.stop_growing()
        await pilot.pause()
        await pilot.pause()
        end = [(p.size.height, s.size.height) for p, s in zip(plain.children, steady.children)]
        return mid, end

    rows, (mid, end) = grow_word_by_word(growing=True, after=finish_and_start_another)
    assert GROW_LINES > 1
    assert max(p for p, _, _ in rows) > GROW_LINES  # long enough to need a second step
    assert all(s == -(-p // GROW_LINES) * GROW_LINES for p, s, _ in rows), rows
    assert_layouts_only_on_height_change(rows)
    # a finished paragraph takes its exact height; the new last one claims a step; then all exact
    (first_plain, first_steady), (last_plain, last_steady) = mid
    assert first_steady == first_plain and last_plain == 1 and last_steady == GROW_LINES
    assert all(p == s for p, s in end), end
