"""A conversation as a readable Markdown transcript."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sessions.messages import Message
from sessions.thinking import ThinkingSplitter

SPEAKERS = {"user": "You", "assistant": "Assistant", "tool": "Tool"}


def transcript_markdown(title: str, messages: Sequence[Message], *, model: str = "",
                        updated: float | None = None) -> str:
    """Markdown of a conversation: title, model, system prompt, then each message.

    An assistant's thinking becomes a collapsed ``<details>`` block above its answer.
    """
    lines = [f"# {_one_line(title)}", ""]
    facts = [f"Model: {model}"] if model else []
    if updated is not None:
        facts.append("Saved: " + time.strftime("%Y-%m-%d %H:%M", time.localtime(updated)))
    if facts:
        lines += ["*" + " · ".join(facts) + "*", ""]
    for message in messages:
        lines += _message(message)
    return "\n".join(lines).rstrip("\n") + "\n"


def _message(message: Message) -> list[str]:
    if message.role == "system":
        quoted = [f"> {line}" if line else ">" for line in message.content.splitlines()]
        return ["**System prompt**", "", *quoted, ""]
    lines = [f"## {SPEAKERS[message.role]}", ""]
    if message.role != "assistant":
        return lines + [message.content.strip("\n"), ""]
    splitter = ThinkingSplitter()
    splitter.feed(message.content)
    splitter.finish()
    thinking, answer = splitter.parts.thinking.strip("\n"), splitter.parts.answer.strip("\n")
    if thinking:
        lines += ["<details><summary>Thinking</summary>", "", thinking, "", "</details>", ""]
    return lines + [answer or "*(no answer)*", ""]


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "New chat"
