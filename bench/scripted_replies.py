"""Replies of a set length and shape for bench rows that need long ones from any model.

With end of text ignored, a small or random model soon writes chat markup
(``<|im_end|>``, ``<|im_start|>``) in the middle of a reply, which no real reply
holds: the stored text then re-renders as other turns than were generated.
``scripted_replies`` keeps the model's own choice of every other token and
shapes the reply as a Qwen3 reply is shaped: markup never appears, and with
thinking on the reply opens with ``<think>`` and closes it after
``think_tokens`` tokens. The shape is a per-reply mask (``PositionMask``),
applied by the decode loop as a grammar's is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np

from mlxcore.batching.constraints import PositionMask
from mlxcore.batching.runner import BatchRunner


def added_token_ids(tokenizer) -> dict[str, int]:
    """The tokenizer's added tokens (chat markup, think tags), by text."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    return {token.content: token_id for token_id, token in inner.added_tokens_decoder.items()}


class ShapedReply(PositionMask):
    """The model's own choice among every token but the added ones; the think tags where they go."""

    def __init__(self, vocab: int, banned: list[int], forced: dict[int, int]) -> None:
        super().__init__(vocab)
        self.free = np.ones(vocab, dtype=bool)
        self.free[[t for t in banned if t < vocab]] = False
        self.forced = forced

    def allowed(self, position: int) -> np.ndarray:
        if position not in self.forced:
            return self.free
        only = np.zeros(self.vocab, dtype=bool)
        only[self.forced[position]] = True
        return only


@contextmanager
def scripted_replies(tokenizer, *, thinking: bool, think_tokens: int = 100) -> Iterator[None]:
    """Within the block, replies decoded by the Engine are shaped as described in the module docstring."""
    added = added_token_ids(tokenizer)
    forced = {0: added["<think>"], think_tokens: added["</think>"]} if thinking else {}
    banned = sorted(added.values())

    def constraint(runner, request):
        return ShapedReply(runner.engine.model.args.vocab_size, banned, forced)

    with mock.patch.object(BatchRunner, "_constraint", constraint):
        yield
