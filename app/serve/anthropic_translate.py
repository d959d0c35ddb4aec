"""An Anthropic Messages request -> the chat endpoint's ``ChatCompletionRequest``, at the HTTP edge.

Everything below (prompt building, sampling, the worker, usage) then runs as
for ``POST /v1/chat/completions``: nothing there knows a second protocol.

- ``system`` becomes the first message; its text blocks, and those of a message,
  are joined by a blank line.
- A ``thinking`` block on an earlier reply is that reply's reasoning, rendered in
  Qwen3's think block as the chat endpoint's ``reasoning_content`` is.
- ``thinking`` enabled (or adaptive) or disabled is Qwen3's ``enable_thinking``.
- Claude Code's billing header (a first system block ``x-anthropic-billing-header:
  ...cch=<hash>`` whose hash changes every request) is dropped: left in, it would
  make every prompt differ from the previous one at its start, and no turn would
  find its prefix in the KV cache.
- Tools are refused for now (``refuse_tools``), in one place, so that the tool-call
  parser can take them there.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from app.serve.anthropic_schemas import (Message, MessagesPrompt, MessagesRequest, TextBlock, ThinkingBlock,
                                         ThinkingConfig, ToolResultBlock, ToolUseBlock)
from app.serve.errors import APIError
from app.serve.schemas import ChatCompletionRequest, ChatMessage, TemplateKwargs

log = logging.getLogger("mlxchat.serve")
BILLING_HEADER = "x-anthropic-billing-header:"
BLOCK_JOIN = "\n\n"
NO_TOOLS = ("Tools are not supported yet on /v1/messages: mlxchat serve has no tool-call parser. Send the request "
            "without tools, tool_choice, tool_use or tool_result blocks.")


def chat_body(body: MessagesPrompt) -> ChatCompletionRequest:
    """The chat request ``body`` stands for (its sampling fields too, for a ``MessagesRequest``)."""
    refuse_tools(body)
    fields = {"model": body.model, "messages": chat_messages(body),
              "chat_template_kwargs": template_kwargs(body.thinking)}
    if isinstance(body, MessagesRequest):
        fields |= {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
                   "top_k": body.top_k, "stop": body.stop_sequences, "stream": body.stream}
    try:
        return ChatCompletionRequest(**fields)
    except ValidationError as error:  # checked by our own schema already; a 400 all the same, never a 500
        raise APIError(400, f"Invalid request: {error.errors()[0]['msg']}.") from None


def refuse_tools(body: MessagesPrompt) -> None:
    """400 for tools, a tool_choice that demands a call, or a tool block in the conversation."""
    if body.tools:
        raise APIError(400, NO_TOOLS, param="tools", code="tools_not_supported")
    if body.tool_choice is not None and body.tool_choice.type in ("any", "tool"):
        raise APIError(400, NO_TOOLS, param="tool_choice", code="tools_not_supported")
    for i, message in enumerate(body.messages):
        if any(isinstance(block, (ToolUseBlock, ToolResultBlock)) for block in message.content):
            raise APIError(400, NO_TOOLS, param=f"messages.{i}.content", code="tools_not_supported")


def chat_messages(body: MessagesPrompt) -> list[ChatMessage]:
    """The system prompt (when one is left) and the conversation, as the chat endpoint's messages."""
    if body.messages[-1].role == "assistant":
        raise APIError(400, "The last message is the assistant's: mlxchat serve does not continue a reply "
                            "(prefill). End the conversation with a user message.", param="messages")
    system = system_text(body.system)
    first = [ChatMessage(role="system", content=system)] if system is not None else []
    return first + [chat_message(message, i) for i, message in enumerate(body.messages)]


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


def chat_message(message: Message, index: int) -> ChatMessage:
    """One message's text blocks, and on a reply its reasoning (``thinking`` blocks)."""
    texts = [block.text for block in message.content if isinstance(block, TextBlock)]
    thoughts = [block.thinking for block in message.content if isinstance(block, ThinkingBlock)]
    if thoughts and message.role != "assistant":
        raise APIError(400, "A thinking block belongs to an assistant message only.",
                       param=f"messages.{index}.content")
    return ChatMessage(role=message.role, content=BLOCK_JOIN.join(texts),
                       reasoning_content=BLOCK_JOIN.join(thoughts) if thoughts else None)


def template_kwargs(thinking: ThinkingConfig | None) -> TemplateKwargs | None:
    """Anthropic's ``thinking`` as Qwen3's switch; None leaves the server's default."""
    return None if thinking is None else TemplateKwargs(enable_thinking=thinking.type != "disabled")
