"""A Responses request -> the chat endpoint's ``ChatCompletionRequest``, at the HTTP edge.

As for Anthropic's Messages API (``anthropic_translate``), everything below runs
as for ``POST /v1/chat/completions``.

- ``instructions`` is the system message; a string ``input`` one user message.
- Items become messages in order. One reply of the model is its reasoning, its
  text and its calls, in that order, so a ``reasoning`` item, an assistant
  ``message`` and ``function_call`` items that follow one another are one
  assistant message (``reasoning_content``, ``content``, ``tool_calls``), and the
  template writes back what the model wrote. A ``function_call_output`` is a
  ``tool`` message.
- ``function`` tools (flat: ``name``, ``description``, ``parameters``) become the
  chat endpoint's; other tool types are dropped with a warning (``dropped``).
- ``reasoning.effort`` none or minimal turns Qwen3's thinking off, any other on.
- ``tool_choice`` ``required`` or naming a function, and a JSON ``text.format``, are
  the chat endpoint's ``tool_choice`` and ``response_format``: grammars.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pydantic import ValidationError

from app.serve.errors import APIError
from app.serve.responses_schemas import (FunctionCallItem, FunctionCallOutputItem, FunctionChoice, Item,
                                         ReasoningItem, ResponsesRequest, TextFormat)
from app.serve.schemas import (ChatCompletionRequest, ChatMessage, FunctionCall, FunctionSpec, JSONSchemaFormat,
                               NamedFunction, NamedToolChoice, ResponseFormat, Strict, Tool,
                               ToolCallIn)

log = logging.getLogger("mlxchat.serve")
STATELESS = ("mlxchat serve does not store responses (it is stateless): send the whole conversation in input, "
             "as Codex does with store false, instead of {field}.")


class FunctionTool(Strict):
    """The Responses API's function tool: flat, not nested under ``function`` as the chat endpoint's."""

    type: str
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


@dataclass
class Translated:
    chat: ChatCompletionRequest
    dropped: list[str] = field(default_factory=list)  # the tool types not offered to the model


def translate(body: ResponsesRequest) -> Translated:
    """The chat request ``body`` stands for, and the tool types dropped from it."""
    refuse_state(body)
    tools, dropped = function_tools(body.tools or [])
    try:
        fields = {"model": body.model, "messages": chat_messages(body), "max_tokens": body.max_output_tokens,
                  "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "seed": body.seed,
                  "stream": body.stream, "user": body.user, "priority": body.priority, "keep_alive": body.keep_alive,
                  "reasoning_effort": body.reasoning.effort if body.reasoning is not None else None,
                  "response_format": response_format(body.text.format if body.text else None)}
        return Translated(ChatCompletionRequest(**fields | tool_fields(body, tools)), dropped)
    except ValidationError as error:
        message = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise APIError(400, f"Invalid request: {message}".rstrip(".") + ".") from None


def refuse_state(body: ResponsesRequest) -> None:
    """400 for what needs stored responses."""
    for name in ("previous_response_id", "conversation"):
        if getattr(body, name) is not None:
            raise APIError(400, STATELESS.format(field=name), param=name, code="stateless")


def response_format(format_: TextFormat | None) -> ResponseFormat | None:
    """``text.format`` as the chat endpoint's ``response_format`` (None: text)."""
    if format_ is None or format_.type == "text":
        return None
    if format_.type == "json_object":
        return ResponseFormat(type="json_object")
    if format_.schema_ is None:
        raise APIError(400, "text.format 'json_schema' needs a schema.", param="text.format.schema")
    spec = JSONSchemaFormat.model_validate({"name": format_.name or "output", "schema": format_.schema_,
                                            "description": format_.description, "strict": format_.strict})
    return ResponseFormat(type="json_schema", json_schema=spec)


def function_tools(tools: list[dict]) -> tuple[list[Tool], list[str]]:
    """The function tools in the chat endpoint's shape, and the types of the others (dropped)."""
    kept, dropped = [], []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            dropped.append(str(tool.get("type")))
            continue
        try:
            spec = FunctionTool.model_validate(tool)
            kept.append(Tool(type="function", function=FunctionSpec(
                name=spec.name, description=spec.description, parameters=spec.parameters, strict=spec.strict)))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in (f"tools.{i}", *first["loc"]))
            raise APIError(400, f"Invalid request: {where}: {first['msg']}.", param=where) from None
    if dropped:
        log.warning("tools of types %s are not offered to the model: mlxchat serve runs function tools only",
                    ", ".join(sorted(set(dropped))))
    return kept, dropped


def tool_fields(body: ResponsesRequest, tools: list[Tool]) -> dict:
    """``tools``, ``tool_choice`` (a named function in the chat endpoint's shape) and ``parallel_tool_calls``."""
    choice = body.tool_choice
    if not tools:  # every tool dropped (or none given): only a choice that forces a call means something
        if choice == "required" or isinstance(choice, FunctionChoice):
            raise APIError(400, "tool_choice forces a call, but there is no function tool to call.",
                           param="tool_choice")
        return {}
    if isinstance(choice, FunctionChoice):
        choice = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": body.parallel_tool_calls}


def chat_messages(body: ResponsesRequest) -> list[ChatMessage]:
    """``instructions`` and the items, as the chat endpoint's messages."""
    messages = Conversation()
    if body.instructions is not None:
        messages.add(ChatMessage(role="system", content=body.instructions))
    for item in body.input:
        messages.item(item)
    done = messages.messages
    if not done:
        raise APIError(400, "input holds no message: send at least one.", param="input")
    return done


class Conversation:
    """Messages built from items; the reply being gathered (reasoning, text, calls) is ``_reply``."""

    def __init__(self) -> None:
        self.done: list[ChatMessage] = []
        self._reply: dict | None = None

    def add(self, message: ChatMessage) -> None:
        self._close()
        self.done.append(message)

    def item(self, item: Item) -> None:
        if isinstance(item, FunctionCallOutputItem):
            self.add(ChatMessage(role="tool", tool_call_id=item.call_id, content=item.text))
        elif isinstance(item, ReasoningItem):
            self._part("reasoning", item.text, after=())
        elif isinstance(item, FunctionCallItem):
            call = ToolCallIn(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            self._part("calls", call, after=("reasoning", "content", "calls"))
        elif item.role == "assistant":
            self._part("content", item.text, after=("reasoning",))
        else:
            self.add(ChatMessage(role=item.role, content=item.text))

    def _part(self, kind: str, value: object, *, after: tuple[str, ...]) -> None:
        """Add ``value`` to the reply being gathered; a reply that already holds more than ``after`` is closed
        first (its reasoning, text and calls come in that order)."""
        if self._reply is not None and set(self._reply) - set(after):
            self._close()
        reply = self._reply = self._reply or {}
        if kind == "calls":
            reply.setdefault("calls", []).append(value)
        else:
            reply[kind] = value

    def _close(self) -> None:
        reply, self._reply = self._reply, None
        if reply is None:
            return
        calls = reply.get("calls")
        self.done.append(ChatMessage(role="assistant", content=reply.get("content", None if calls else ""),
                                     reasoning_content=reply.get("reasoning"), tool_calls=calls))

    @property
    def messages(self) -> list[ChatMessage]:
        self._close()
        return self.done
