"""The JSON objects OpenAI's API returns, built from ``ChoiceState``s and ``Delta``s.

Chat: ``chat.completion`` and ``chat.completion.chunk``, with the reasoning
apart from the answer as ``reasoning_content`` (vLLM's convention) and the
tool calls as ``tool_calls`` (streamed: id and name first, then arguments). Legacy
completions: ``text_completion``, streamed as the same object with deltas.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.serve.choices import ChoiceState, Delta, chat_logprobs, completion_logprobs
from mlxcore import CallDelta

TextOf = Callable[[int], str]


@dataclass(frozen=True)
class ReplyHeader:
    """What every object of one reply repeats: its id, creation time and model."""

    kind: str  # "chat" or "completion"
    model: str
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def object(self, chunk: bool = False) -> dict:
        """The fields every object starts with; a chat chunk is a ``chat.completion.chunk``."""
        if self.kind == "chat":
            name = "chat.completion.chunk" if chunk else "chat.completion"
            return {"id": f"chatcmpl-{self.id}", "object": name, "created": self.created, "model": self.model}
        return {"id": f"cmpl-{self.id}", "object": "text_completion", "created": self.created, "model": self.model}


def chat_message(choice: ChoiceState, thinking: bool) -> dict:
    message = {"role": "assistant", "content": choice.content}
    if thinking:
        message["reasoning_content"] = choice.reasoning or None
    if choice.tool_calls:
        message["content"] = choice.content or None  # OpenAI's: no text beside the calls is null
        message["tool_calls"] = [call.as_dict() for call in choice.tool_calls]
    return message


def tool_call_chunks(calls: tuple[CallDelta, ...]) -> list[dict]:
    """``delta.tool_calls``: a call's index, id, type and name in its first piece; arguments after."""
    pieces = []
    for call in calls:
        function = ({"name": call.name} if call.id is not None else {}) | {"arguments": call.arguments}
        head = {"id": call.id, "type": "function"} if call.id is not None else {}
        pieces.append({"index": call.index} | head | {"function": function})
    return pieces


def chat_completion(header: ReplyHeader, choices: list[ChoiceState], usage: dict, *, thinking: bool,
                    text_of: TextOf | None) -> dict:
    """The whole reply of a non-streaming chat request; ``text_of`` set when logprobs were asked for."""
    return header.object() | {
        "choices": [{"index": c.index, "message": chat_message(c, thinking),
                     "logprobs": chat_logprobs(c.logprobs, text_of) if text_of else None,
                     "finish_reason": c.finish_reason} for c in choices],
        "usage": usage}


def text_completion(header: ReplyHeader, choices: list[ChoiceState], usage: dict, *,
                    text_of: TextOf | None) -> dict:
    """The whole reply of a non-streaming completions request."""
    return header.object() | {
        "choices": [{"index": c.index, "text": c.content,
                     "logprobs": completion_logprobs(c.logprobs, text_of) if text_of else None,
                     "finish_reason": c.finish_reason} for c in choices],
        "usage": usage}


def chat_chunk(head: dict, choice: ChoiceState, delta: Delta, *, text_of: TextOf | None, usage_field: bool) -> dict:
    """One streamed event of ``choice``; ``head``: ``header.object(chunk=True)``, made once per stream (``usage:
    null`` on each when the client asked for usage)."""
    body: dict = {}
    if delta.reasoning:
        body["reasoning_content"] = delta.reasoning
    if delta.content:
        body["content"] = delta.content
    if delta.tool_calls:
        body["tool_calls"] = tool_call_chunks(delta.tool_calls)
    logprobs = chat_logprobs(list(delta.logprobs), text_of) if text_of and delta.logprobs else None
    chunk = head | {"choices": [{"index": choice.index, "delta": body, "logprobs": logprobs,
                                 "finish_reason": delta.finish_reason}]}
    return chunk | ({"usage": None} if usage_field else {})


def chat_role_chunk(head: dict, index: int, usage_field: bool) -> dict:
    """The first chunk of a choice: the assistant role, as OpenAI's stream begins."""
    chunk = head | {"choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]}
    return chunk | ({"usage": None} if usage_field else {})


def completion_chunk(head: dict, choice: ChoiceState, delta: Delta, *, text_of: TextOf | None,
                     usage_field: bool) -> dict:
    """One streamed event of a completions choice (``head`` as for ``chat_chunk``)."""
    offset = len(choice.content) - len(delta.content)  # where this delta starts in the choice's text
    logprobs = completion_logprobs(list(delta.logprobs), text_of, offset) if text_of and delta.logprobs else None
    chunk = head | {"choices": [{"index": choice.index, "text": delta.content, "logprobs": logprobs,
                                 "finish_reason": delta.finish_reason}]}
    return chunk | ({"usage": None} if usage_field else {})


def usage_chunk(head: dict, usage: dict) -> dict:
    """The last chunk when ``stream_options.include_usage`` is set: no choices, the whole request's usage."""
    return head | {"choices": [], "usage": usage}
