"""Pure text helpers for the chat view: a reply's thinking and answer, and the code blocks of a message."""

from __future__ import annotations

import re

from sessions import ThinkingSplitter

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})[^\n]*\n(?P<code>.*?)^(?P=fence)[ \t]*$", re.S | re.M)


def split_reply(content: str) -> tuple[str, str]:
    """(thinking, answer) of an assistant message as stored (``<think>...</think>`` then the answer)."""
    splitter = ThinkingSplitter()
    splitter.feed(content)
    splitter.finish()
    return splitter.parts.thinking, splitter.parts.answer


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced code blocks in ``markdown``, in order (without the fences)."""
    return [match.group("code").rstrip("\n") for match in _FENCE.finditer(markdown)]


def word_count(text: str) -> int:
    return len(text.split())
