"""The pairing rules of a conversation, the same for the three APIs (docs/serve.md, Pairing rules).

OpenAI's chat messages, the Responses API's input items and Anthropic's messages
all become the chat endpoint's messages (``ChatCompletionRequest``), whose
validator applies these rules, so each API refuses the same conversations, with
the same sentences, as a 400:

1. the conversation does not end with an assistant message (the server does not
   continue a reply: that is prefill, which it does not do);
2. every tool result answers a call of the assistant message just before it (only
   other results in between), each call at most once;
3. every call of an assistant message has its result before the next message that
   is not a result (a system message may come between: it is no turn of the dialogue).

The sentences name the calls by their ids, which each API spells as its client sent
them (``tool_call_id``, ``call_id``, ``tool_use_id``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Message(Protocol):
    role: str
    tool_calls: Sequence | None
    tool_call_id: str | None


def check_pairing(messages: Sequence[Message]) -> None:
    """``ValueError`` with a sentence for the first rule ``messages`` break."""
    if messages and messages[-1].role == "assistant":
        raise ValueError("the last message is the assistant's, and mlxchat serve does not continue a reply "
                         "(prefill): end the conversation with a user message or the results of its tool calls")
    waiting: dict[str, str] = {}  # the calls of the last assistant message not answered yet: id -> tool name
    answered: set[str] = set()
    for message in messages:
        if message.role == "tool":
            _answer(waiting, answered, message.tool_call_id)
            continue
        if message.role in ("system", "developer"):
            continue
        if waiting:
            ids = ", ".join(repr(i) for i in waiting)
            raise ValueError(f"the tool calls {ids} (of {', '.join(sorted(set(waiting.values())))}) have no "
                             "results: send a result for each call right after the message that made it")
        answered.clear()
        if message.role == "assistant":
            waiting = {call.id: call.function.name for call in message.tool_calls or ()}


def _answer(waiting: dict[str, str], answered: set[str], call_id: str | None) -> None:
    if call_id is None:
        raise ValueError("a tool result does not say which call it answers (its tool_call_id)")
    if call_id in answered:
        raise ValueError(f"the call {call_id!r} has two results")
    if call_id not in waiting:
        raise ValueError(f"the tool result for {call_id!r} answers no call of the assistant message before it: "
                         "results follow the message that made their calls")
    del waiting[call_id]
    answered.add(call_id)
