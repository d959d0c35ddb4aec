"""The title a chat is listed under: the user's, else its first user message's first line, else "New chat"."""

from __future__ import annotations

from collections.abc import Iterable


def shown_title(title: str | None, history: Iterable[tuple[str, str]]) -> str:
    """``history``: (role, content) pairs. Pure Python: the store and the chat window use the same rule."""
    if title:
        return title
    first = next((content for role, content in history if role == "user"), "")
    line = first.strip().splitlines()[0] if first.strip() else ""
    return (line[:47] + "...") if len(line) > 50 else (line or "New chat")
