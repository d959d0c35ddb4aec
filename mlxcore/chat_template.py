"""Chat messages -> prompt token ids, through the model's own chat template.

Tools (OpenAI function schemas), assistant messages with ``tool_calls`` and
``role: tool`` results go to the template as Hugging Face's ``apply_chat_template``
takes them: each template writes them in the format its model was trained on
(Qwen3: a ``# Tools`` system block, ``<tool_call>`` JSON, ``<tool_response>``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mlxcore.errors import PromptError

if TYPE_CHECKING:  # (imported for its type only: the window's process never loads mlx-lm)
    from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlxcore.think_blocks import OPEN, keep_empty_blocks

ROLES = ("system", "user", "assistant", "tool")
TURN_START = "<|im_start|>"


def render_chat(tokenizer: TokenizerWrapper | None, messages: Sequence[dict], *, enable_thinking: bool,
                add_generation_prompt: bool = True, tools: Sequence[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` (dicts with "role" and "content") as the model's template renders them."""
    text = render_chat_text(tokenizer, messages, enable_thinking=enable_thinking,
                            add_generation_prompt=add_generation_prompt, tools=tools)
    assert tokenizer is not None  # (render_chat_text refused None)
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_chat_text(tokenizer: TokenizerWrapper | None, messages: Sequence[dict], *, enable_thinking: bool,
                     add_generation_prompt: bool = True, tools: Sequence[dict] | None = None) -> str:
    """The text ``render_chat`` tokenizes; ``tools`` (OpenAI function tools) offered to the model when given.
    With thinking off, replies stored with an empty think block keep it in history (``think_blocks``)."""
    if tokenizer is None:
        raise PromptError("This model has no tokenizer, so it cannot chat.")
    for message in messages:
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise PromptError(f"A chat message needs a role ({', '.join(ROLES)}) and text content: {message!r}")
    if not getattr(tokenizer, "has_chat_template", False):
        raise PromptError("This model has no chat template: pick a chat (instruct) model.")
    extra = {"tools": list(tools)} if tools else {}
    text = tokenizer.apply_chat_template([template_message(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt,
                                         enable_thinking=enable_thinking, tokenize=False, **extra)
    return text if enable_thinking else keep_empty_blocks(text, messages)


def turn_marks(tokenizer: TokenizerWrapper | None) -> tuple[int, int] | None:
    """The ids of the tokens that open every turn (``<|im_start|>``) and a think block (``<think>``) in Qwen's
    templates; None for a tokenizer without both."""
    if tokenizer is None:
        return None
    start, think = token_id(tokenizer, TURN_START), token_id(tokenizer, OPEN)
    return (start, think) if start is not None and think is not None else None


def token_id(tokenizer: TokenizerWrapper, text: str) -> int | None:
    """The id of ``text`` where ``tokenizer`` spells it as one token (an added tag such as ``<think>``), else None."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def template_message(message: dict) -> dict:
    """``message`` as templates read it: a call's arguments as an object (OpenAI sends JSON text; Qwen3's
    template writes an object as JSON, Qwen3-Coder's walks its items)."""
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call.get("function", call))
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except ValueError:
                raise PromptError(f"A tool call's arguments are not JSON: {function['arguments']!r}") from None
        calls.append({**call, "function": function} if "function" in call else function)
    return {**message, "tool_calls": calls}
