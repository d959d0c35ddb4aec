"""An Anthropic Messages request -> the chat endpoint's ``ChatCompletionRequest``, at the HTTP edge.

Everything below (prompt building, sampling, the worker, usage) then runs as
for ``POST /v1/chat/completions``: nothing there knows a second protocol.

- ``system`` becomes the first message; its text blocks, and those of a message,
  are joined by a blank line. A ``system`` message within ``messages`` (Claude Code
  sends one after the first user turn) stays where it is, a system turn of the chat.
- A ``thinking`` block on an earlier reply is that reply's reasoning, rendered in
  Qwen3's think block as the chat endpoint's ``reasoning_content`` is.
- ``thinking`` enabled (or adaptive) or disabled is Qwen3's ``enable_thinking``.
- Claude Code's billing header (a first system block ``x-anthropic-billing-header:
  ...cch=<hash>`` whose hash changes every request) is dropped: left in, it would
  make every prompt differ from the previous one at its start, and no turn would
  find its prefix in the KV cache.
- Tools become the chat endpoint's function tools; ``tool_use`` blocks an assistant
  message's ``tool_calls`` (the input as JSON text); the ``tool_result`` blocks of a
  user message one ``tool`` message each, before the message's text. ``tool_choice``
  ``auto`` and ``none`` are the chat endpoint's; ``any`` its ``required`` and ``tool``
  its named choice, which make the model call by a grammar; ``output_config.format``
  (structured output) is its ``response_format`` ``json_schema``, a grammar too.
"""

from __future__ import annotations

import json
import logging

from pydantic import ValidationError

from app.serve.anthropic_schemas import (AnthropicTool, Message, MessagesPrompt, MessagesRequest, OutputFormat,
                                         TextBlock, ThinkingBlock, ThinkingConfig, ToolChoice, ToolResultBlock,
                                         ToolUseBlock)
from app.serve.errors import APIError
from app.serve.schemas import (ChatCompletionRequest, ChatMessage, FunctionCall, FunctionSpec, JSONSchemaFormat,
                               NamedFunction, NamedToolChoice, ResponseFormat, TemplateKwargs, Tool, ToolCallIn)

log = logging.getLogger("mlxchat.serve")
BILLING_HEADER = "x-anthropic-billing-header:"
BLOCK_JOIN = "\n\n"
ERROR_MARK = "Error: "  # before an is_error result's text: Qwen's templates have no field for it


def chat_body(body: MessagesPrompt) -> ChatCompletionRequest:
    """The chat request ``body`` stands for (its sampling fields too, for a ``MessagesRequest``)."""
    fields = {"model": body.model, "messages": chat_messages(body),
              "chat_template_kwargs": template_kwargs(body.thinking)} | tool_fields(body.tools, body.tool_choice)
    if isinstance(body, MessagesRequest):
        fields |= {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
                   "top_k": body.top_k, "stop": body.stop_sequences, "stream": body.stream,
                   "keep_alive": body.keep_alive}
    try:
        if isinstance(body, MessagesRequest) and body.output_config and body.output_config.format:
            fields["response_format"] = response_format(body.output_config.format)
        return ChatCompletionRequest(**fields)
    except ValidationError as error:  # checked by our own schema already; a 400 all the same, never a 500
        message = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise APIError(400, f"Invalid request: {message}".rstrip(".") + ".") from None


def tool_fields(tools: list[AnthropicTool] | None, choice: ToolChoice | None) -> dict:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of the chat request: ``any`` is its ``required``,
    ``tool`` its named choice (both a grammar that makes the model call)."""
    if not tools:
        if choice is not None and choice.type in ("any", "tool"):
            raise APIError(400, f"tool_choice {choice.type!r} needs tools.", param="tool_choice")
        return {}
    fields: dict = {"tools": [Tool(type="function", function=FunctionSpec(
        name=tool.name, description=tool.description, parameters=tool.input_schema)) for tool in tools]}
    if choice is not None:
        fields["tool_choice"] = chat_choice(choice)
        if choice.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
    return fields


def chat_choice(choice: ToolChoice) -> str | NamedToolChoice:
    """Anthropic's ``tool_choice`` as the chat endpoint's: ``any`` is ``required``, ``tool`` a named function."""
    if choice.type == "tool":
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return "required" if choice.type == "any" else choice.type


def response_format(given: OutputFormat) -> ResponseFormat:
    """``output_config.format`` as the chat endpoint's ``response_format`` (a grammar)."""
    spec = JSONSchemaFormat.model_validate({"name": "output", "schema": given.schema_})
    return ResponseFormat(type="json_schema", json_schema=spec)


def chat_messages(body: MessagesPrompt) -> list[ChatMessage]:
    """The system prompt (when one is left) and the conversation, as the chat endpoint's messages."""
    system = system_text(body.system)
    first = [ChatMessage(role="system", content=system)] if system is not None else []
    return first + [chat for i, message in enumerate(body.messages) for chat in chat_message(message, i)]


def system_text(blocks: list[TextBlock] | None) -> str | None:
    """The system blocks' text, Claude Code's billing header dropped; None when nothing is left."""
    if blocks is None:
        return None
    kept = []
    for block in blocks:
        if block.text.startswith(BILLING_HEADER):
            log.debug("dropped a billing-header system block (it would defeat the prefix cache): %r", block.text)
        else:
            kept.append(block.text)
    return BLOCK_JOIN.join(kept) if kept else None


def chat_message(message: Message, index: int) -> list[ChatMessage]:
    """One message as the chat endpoint's: a reply with its reasoning and calls; a user turn's tool results
    (one ``tool`` message each) and then its text, if it has any."""
    where = f"messages.{index}.content"
    texts = BLOCK_JOIN.join(block.text for block in message.content if isinstance(block, TextBlock))
    thoughts = [block.thinking for block in message.content if isinstance(block, ThinkingBlock)]
    calls = [block for block in message.content if isinstance(block, ToolUseBlock)]
    results = [block for block in message.content if isinstance(block, ToolResultBlock)]
    if message.role == "system":  # rendered where it stands, as Qwen's template renders a later system turn
        if not all(isinstance(block, TextBlock) for block in message.content):
            raise APIError(400, "A system message holds text blocks only.", param=where)
        return [ChatMessage(role="system", content=texts)]
    if message.role == "user":
        if thoughts or calls:
            raise APIError(400, "thinking and tool_use blocks belong to assistant messages only.", param=where)
        told = [tool_message(block) for block in results]
        return told + ([ChatMessage(role="user", content=texts)] if texts or not told else [])
    if results:
        raise APIError(400, "tool_result blocks belong to user messages only.", param=where)
    return [ChatMessage(role="assistant", content=texts if texts or not calls else None,
                        reasoning_content=BLOCK_JOIN.join(thoughts) if thoughts else None,
                        tool_calls=[tool_call(block) for block in calls] or None)]


def tool_call(block: ToolUseBlock) -> ToolCallIn:
    # the input as JSON text, spelled as Qwen3 writes it (", " and ": "), so the template writes back what it wrote
    arguments = json.dumps(block.input, ensure_ascii=False)
    return ToolCallIn(id=block.id, function=FunctionCall(name=block.name, arguments=arguments))


def tool_message(block: ToolResultBlock) -> ChatMessage:
    """A ``tool`` message: the result's text (its text blocks joined), marked when it is an error."""
    if isinstance(block.content, list):
        text = BLOCK_JOIN.join(part.text for part in block.content)
    else:
        text = block.content or ""
    text = ERROR_MARK + text if block.is_error else text
    return ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=text)


def template_kwargs(thinking: ThinkingConfig | None) -> TemplateKwargs | None:
    """Anthropic's ``thinking`` as Qwen3's switch; None leaves the server's default."""
    return None if thinking is None else TemplateKwargs(enable_thinking=thinking.type != "disabled")
