"""Chat messages -> prompt token ids, through the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcore.errors import PromptError
from mlxcore.think_blocks import keep_empty_blocks

ROLES = ("system", "user", "assistant", "tool")


def render_chat(tokenizer, messages: Sequence[dict], *, enable_thinking: bool,
                add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` (dicts with "role" and "content") as the model's template renders them.

    With thinking off, replies stored with an empty think block keep it in history (see
    ``mlxcore.think_blocks``); with thinking on, history renders exactly as the template does.
    """
    text = render_chat_text(tokenizer, messages, enable_thinking=enable_thinking,
                            add_generation_prompt=add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_chat_text(tokenizer, messages: Sequence[dict], *, enable_thinking: bool,
                     add_generation_prompt: bool = True) -> str:
    """The text ``render_chat`` tokenizes."""
    if tokenizer is None:
        raise PromptError("This model has no tokenizer, so it cannot chat.")
    for message in messages:
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise PromptError(f"A chat message needs a role ({', '.join(ROLES)}) and text content: {message!r}")
    if not getattr(tokenizer, "has_chat_template", False):
        raise PromptError("This model has no chat template: pick a chat (instruct) model.")
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                         enable_thinking=enable_thinking, tokenize=False)
    return text if enable_thinking else keep_empty_blocks(text, messages)
