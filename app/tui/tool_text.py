"""Tool turns as the chat shows them: a reply's calls in one line each, and each result with the call it answers.

Qwen3 writes its calls in the reply (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``)
and each result comes back as a ``tool`` message, in the calls' order. The
window shows a call as a line of the reply, and its result as a collapsible
block with the call's name and arguments: the n-th ``tool`` message after a
reply answers that reply's n-th call.
"""

from __future__ import annotations

import json
import re

from mlxcore import ToolCallError, parse_call

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
ARGUMENTS_SHOWN = 60  # characters of the arguments in a block's title


def calls_in(text: str) -> list[tuple[str, str]]:
    """(name, arguments as JSON text) of every call written whole in ``text`` (one that does not parse: skipped)."""
    found = []
    for match in _CALL.finditer(text):
        try:
            call = parse_call(match.group(1))
        except ToolCallError:
            continue
        found.append((call.name, call.arguments))
    return found


def shown_calls(answer: str) -> str:
    """The answer with each call written as one line of Markdown (a call that does not parse stays as text)."""
    def line(match: re.Match) -> str:
        try:
            call = parse_call(match.group(1))
        except ToolCallError:
            return match.group(0)
        return f"*calls* `{call.name}`"
    return _CALL.sub(line, answer).strip()


def answered_call(records: list[tuple[str, str]], index: int) -> tuple[str, str] | None:
    """The (name, arguments) of the call that the ``tool`` message ``records[index]`` answers; None if unknown."""
    first = index
    while first > 0 and records[first - 1][0] == "tool":
        first -= 1
    if first == 0 or records[first - 1][0] != "assistant":
        return None
    calls = calls_in(records[first - 1][1])
    return calls[index - first] if index - first < len(calls) else None


def pretty_arguments(arguments: str) -> str:
    """The arguments as indented JSON (as written, when they are not JSON)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def call_title(name: str, arguments: str, result: str | None = None) -> str:
    """``name(arguments)``, the arguments cut short, then the first line of the result."""
    try:
        compact = json.dumps(json.loads(arguments), ensure_ascii=False, separators=(", ", ": "))
    except ValueError:
        compact = arguments
    if len(compact) > ARGUMENTS_SHOWN:
        compact = compact[:ARGUMENTS_SHOWN - 1] + "…"
    title = f"{name} {compact}"
    if result is not None:
        first = result.strip().splitlines()[0] if result.strip() else "(empty)"
        title += f" → {first[:ARGUMENTS_SHOWN]}"
    return title
