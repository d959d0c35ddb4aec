"""Plain decoding: one token per forward pass of the target, pipelined like mlx-lm's."""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import mlx.nn as nn

from mlxcore.kv.base import PENDING
from mlxcore.params import SamplingParams
from mlxcore.sampling import KeyStream, next_token


class TokenPicker:
    """Chooses the next token from logits (1, V); keeps the recent ids for the repetition penalty."""

    def __init__(self, params: SamplingParams, history: list[int]) -> None:
        self.params = params
        self.keys = KeyStream(params.seed)
        context = params.repetition_context if params.repetition_penalty != 1.0 else 0
        self.recent = mx.array(history[-context:], dtype=mx.int32) if context else None

    def __call__(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        """Returns (token (1,), its log-probability (1,)) as lazy arrays."""
        key = None if self.params.greedy else self.keys.next()
        token, logprob = next_token(logits, self.params, key, self.recent)
        if self.recent is not None:
            keep = self.params.repetition_context - 1
            self.recent = mx.concatenate([self.recent[-keep:] if keep else self.recent[:0], token.astype(mx.int32)])
        return token, logprob


def forward_last(model: nn.Module, cache, tokens: mx.array) -> mx.array:
    """Logits (1, V) of the last of ``tokens`` (1, n), fed into ``cache``."""
    return model(tokens, cache=cache.layers)[:, -1, :]


def plain_decode(model: nn.Module, cache, last_prompt_token: int, picker: TokenPicker) -> Iterator[tuple[int, float]]:
    """Feed the last prompt token, then yield (token, logprob) without end.

    When a token is yielded the cache already holds it (its forward pass is
    queued), so the consumer may stop at any point and the cache is exact.
    """
    cache.begin([last_prompt_token])
    token, logprob = picker(forward_last(model, cache, mx.array([[last_prompt_token]])))
    mx.async_eval(token, logprob)
    while True:
        # Queue the pass on `token` before reading its value, so building this step's
        # graph overlaps computing the last one; the cache learns the id right after.
        cache.begin([PENDING])
        next_token, next_logprob = picker(forward_last(model, cache, token[None]))
        mx.async_eval(next_token, next_logprob)
        value = token.item()
        cache.correct_tail([value])
        yield value, logprob.item()
        token, logprob = next_token, next_logprob
