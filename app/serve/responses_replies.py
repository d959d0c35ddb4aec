"""The JSON objects OpenAI's Responses API returns, built from the chat endpoint's ``ChoiceState``.

A response's ``output`` is a ``reasoning`` item (when the model thought; its text
as ``reasoning_text`` content, not summarized), a ``message`` item with one
``output_text`` part, and a ``function_call`` item per call. A reply cut at
``max_output_tokens`` is ``incomplete``. Usage counts the whole prompt as
``input_tokens``, of which ``input_tokens_details.cached_tokens`` were found in
the KV pool (prefix hits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.serve.choices import ChoiceState
from app.serve.replies import ReplyHeader
from app.serve.responses_schemas import ResponsesRequest
from mlxcore import ToolCall

CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class ResponseIds:
    """The ids of one response and its items, from its reply's id (``ReplyHeader.id``)."""

    base: str

    @property
    def response(self) -> str:
        return f"resp_{self.base}"

    def item(self, prefix: str, index: int) -> str:
        """An item's id: ``rs_`` (reasoning), ``msg_`` (message) or ``fc_`` (function call), with its place."""
        return f"{prefix}_{self.base}{index:02d}"


def status(choice: ChoiceState) -> tuple[str, dict | None]:
    """(``status``, ``incomplete_details``) of a finished reply."""
    if choice.finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def response_usage(usage: dict, reasoning_tokens: int) -> dict:
    """The Responses API's usage from the chat endpoint's."""
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": usage["total_tokens"]}


def reasoning_item(item_id: str, text: str, done: bool = True) -> dict:
    content = [{"type": "reasoning_text", "text": text}] if done else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content,
            "status": "completed" if done else "in_progress"}


def message_item(item_id: str, text: str | None) -> dict:
    """A message item; ``text`` None: the empty one a stream adds first."""
    content = [] if text is None else [output_text(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "content": content,
            "status": "in_progress" if text is None else "completed"}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call: ToolCall, arguments: str | None = None) -> dict:
    """A function_call item; ``arguments`` "" for the one a stream adds first."""
    done = arguments is None
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if done else arguments, "status": "completed" if done else "in_progress"}


def output_items(ids: ResponseIds, choice: ChoiceState, thinking: bool) -> list[dict]:
    """A finished reply's items: its reasoning, its text, its calls."""
    items = [reasoning_item(ids.item("rs", 0), choice.reasoning)] if thinking and choice.reasoning else []
    if choice.content or not (items or choice.tool_calls):
        items.append(message_item(ids.item("msg", len(items)), choice.content))
    return items + [function_call_item(ids.item("fc", len(items) + i), call)
                    for i, call in enumerate(choice.tool_calls)]


def response_object(body: ResponsesRequest, header: ReplyHeader, ids: ResponseIds, *, state: str,
                    output: list[dict], usage: dict | None, details: dict | None = None) -> dict:
    """A ``response``: the whole reply (``state`` completed or incomplete), or a stream's first (in_progress,
    no output, no usage). The request's settings are echoed, as OpenAI's API does."""
    return {"id": ids.response, "object": "response", "created_at": header.created, "status": state,
            "error": None, "incomplete_details": details, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "model": header.model, "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False, "previous_response_id": None,
            "reasoning": (body.reasoning.model_dump() if body.reasoning else {"effort": None, "summary": None}),
            "store": False, "temperature": body.temperature, "top_p": body.top_p,
            "text": {"format": _format(body)}, "tool_choice": _choice(body), "tools": body.tools or [],
            "truncation": "disabled", "usage": usage, "user": body.user, "metadata": body.metadata or {}}


def _format(body: ResponsesRequest) -> dict:
    given = body.text.format if body.text is not None else None
    return given.model_dump(by_alias=True, exclude_none=True) if given is not None else {"type": "text"}


def _choice(body: ResponsesRequest) -> str | dict:
    choice = body.tool_choice or "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def whole_response(body: ResponsesRequest, header: ReplyHeader, choice: ChoiceState, usage: dict, *,
                   thinking: bool, count: CountTokens) -> dict:
    """The reply of a request that is not streamed."""
    ids = ResponseIds(header.id)
    state, details = status(choice)
    used = response_usage(usage, count(choice.reasoning) if choice.reasoning else 0)
    return response_object(body, header, ids, state=state, output=output_items(ids, choice, thinking),
                           usage=used, details=details)
