"""Chat messages -> prompt token ids, through the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcore.errors import PromptError

ROLES = ("system", "user", "assistant", "tool")


def render_chat(tokenizer, messages: Sequence[dict], *, enable_thinking: bool,
                add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` (dicts with "role" and "content") as the model's template renders them."""
    if tokenizer is None:
        raise PromptError("This model has no tokenizer, so it cannot chat.")
    for message in messages:
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise PromptError(f"A chat message needs a role ({', '.join(ROLES)}) and text content: {message!r}")
    if not getattr(tokenizer, "has_chat_template", False):
        raise PromptError("This model has no chat template: pick a chat (instruct) model.")
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                        enable_thinking=enable_thinking, tokenize=True)
    return list(ids)
