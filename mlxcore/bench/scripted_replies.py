"""Replies of a set length and shape for bench rows that need long ones from any model.

With end of text ignored, a small or random model soon writes chat markup
(``<|im_end|>``, ``<|im_start|>``) in the middle of a reply, which no real reply
holds: the stored text then re-renders as other turns than were generated.
``scripted_replies`` keeps the model's own choice of every other token and
shapes the reply as a Qwen3 reply is shaped: markup never appears, and with
thinking on the reply opens with ``<think>`` and closes it after
``think_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import mlx.core as mx

from mlxcore.batching import live as live_module
from mlxcore.sampling import TokenPicker


def added_token_ids(tokenizer) -> dict[str, int]:
    """The tokenizer's added tokens (chat markup, think tags), by text."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    return {token.content: token_id for token_id, token in inner.added_tokens_decoder.items()}


@contextmanager
def scripted_replies(tokenizer, *, thinking: bool, think_tokens: int = 100) -> Iterator[None]:
    """Within the block, plain decoding by the Engine picks as described in the module docstring."""
    added = added_token_ids(tokenizer)
    forced = {0: added["<think>"], think_tokens: added["</think>"]} if thinking else {}
    banned = mx.array(sorted(added.values()))

    class ScriptedPicker(TokenPicker):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.step = 0

        def __call__(self, logits: mx.array) -> tuple[mx.array, mx.array]:
            masked = logits.at[:, banned].add(-mx.inf)
            token, logprob = super().__call__(masked)
            if self.step in forced:
                token = mx.array([forced[self.step]], dtype=token.dtype)
                if self.recent is not None:  # the repetition penalty's memory holds the token kept
                    self.recent = mx.concatenate([self.recent[:-1], token.astype(mx.int32)])
            self.step += 1
            return token, logprob

    with mock.patch.object(live_module, "TokenPicker", ScriptedPicker):
        yield
