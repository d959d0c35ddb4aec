"""The JSON objects Anthropic's Messages API returns, built from the chat endpoint's ``ChoiceState``.

A reply is a ``message`` whose content is a ``thinking`` block (when the model
thought), a ``text`` block and a ``tool_use`` block per call (``stop_reason``
``tool_use`` when the reply ended with calls). Usage splits the prompt as Anthropic's does:
``input_tokens`` are the prompt tokens computed for this request and
``cache_read_input_tokens`` those found in the KV pool (prefix hits); nothing is
written to a cache on request, so ``cache_creation_input_tokens`` is 0.
"""

from __future__ import annotations

from collections.abc import Callable

from app.serve.choices import ChoiceState
from app.serve.replies import ReplyHeader
from mlxcore import ToolCall

Decode = Callable[[list[int]], str]


def message_usage(usage: dict, *, cached_known: bool = True) -> dict:
    """Anthropic's usage from the chat endpoint's; ``cached_known`` off at a stream's start (hits come later)."""
    prompt = usage["prompt_tokens"]
    cached = usage["prompt_tokens_details"]["cached_tokens"] if cached_known else 0
    return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": usage["completion_tokens"]}


def stop_reason(choice: ChoiceState, decode: Decode) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``) of a finished choice; ``decode`` spells token ids as text."""
    if choice.finish_reason == "tool_calls":  # also when parallel_tool_calls false stopped it at a call's end
        return "tool_use", None
    if choice.final is not None and choice.final.finish_reason == "stop":
        whole = decode([entry.token for entry in choice.logprobs])
        return "stop_sequence", matched_stop(whole, choice.final.text, choice.stops)
    return ("max_tokens" if choice.finish_reason == "length" else "end_turn"), None


def matched_stop(whole: str, text: str, stops: tuple[str, ...]) -> str:
    """Which of ``stops`` the engine cut the reply before: ``whole`` is its tokens' text, ``text`` what was kept.

    The engine never emits a stop string's text (it holds back what may begin one),
    so the tokens are decoded again; of the stops found there, the first to end."""
    after = [stop for stop in stops if whole.startswith(stop, len(text))]
    if after:
        return min(after, key=len)
    found = [(whole.find(stop) + len(stop), stop) for stop in stops if stop in whole]
    return min(found)[1] if found else stops[0]


def tool_use_id(call: ToolCall) -> str:
    """Anthropic's spelling of a call's id (``toolu_...``); any id sent back is taken as it is."""
    return "toolu_" + call.id.removeprefix("call_")


def tool_use(call: ToolCall, *, streamed: bool = False) -> dict:
    """A ``tool_use`` block; a stream's starts empty (``input_json_delta``s fill it)."""
    return {"type": "tool_use", "id": tool_use_id(call), "name": call.name,
            "input": {} if streamed else call.parsed_arguments()}


def message_shell(header: ReplyHeader, content: list[dict], usage: dict, stop: tuple[str | None, str | None]) -> dict:
    """A message object: the whole reply, or (empty, no stop reason) the one a stream starts with."""
    return {"id": f"msg_{header.id}", "type": "message", "role": "assistant", "model": header.model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage}


def message(header: ReplyHeader, choice: ChoiceState, usage: dict, *, thinking: bool, decode: Decode) -> dict:
    """The whole reply of a request that is not streamed."""
    content = [{"type": "thinking", "thinking": choice.reasoning, "signature": ""}] \
        if thinking and choice.reasoning else []
    if choice.content or not (content or choice.tool_calls):
        content.append({"type": "text", "text": choice.content})
    content += [tool_use(call) for call in choice.tool_calls]
    return message_shell(header, content, message_usage(usage), stop_reason(choice, decode))
