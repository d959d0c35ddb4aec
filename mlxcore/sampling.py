"""Sampling in two steps: logits -> probability distribution, then draw.

Speculative decoding compares the target's and the draft's distributions, so
both go through exactly the same ``distribution`` transform. Temperature 0 is a
true greedy path: ``distribution`` returns a one-hot vector and ``draw`` is an
argmax, with no division by a tiny temperature.
"""

from __future__ import annotations

import os

import mlx.core as mx

from mlxcore.params import SamplingParams


def penalize_repeats(logits: mx.array, recent: mx.array | None, penalty: float) -> mx.array:
    """Make tokens in ``recent`` less likely: positive logits / penalty, negative ones x penalty.

    logits: (..., V); recent: (n,) token ids.
    """
    if recent is None or recent.size == 0 or penalty == 1.0:
        return logits
    seen = mx.zeros(logits.shape[-1], dtype=mx.int32)
    seen[recent] = 1
    scaled = mx.where(logits > 0, logits / penalty, logits * penalty)
    return mx.where(seen.astype(mx.bool_), scaled, logits)


def _mask_top_k(probs: mx.array, k: int) -> mx.array:
    if k <= 0 or k >= probs.shape[-1]:
        return probs
    kth = mx.sort(probs, axis=-1)[..., -k : -k + 1]  # (..., 1): the k-th largest
    return mx.where(probs >= kth, probs, 0.0)


def _mask_top_p(probs: mx.array, p: float) -> mx.array:
    if p >= 1.0:
        return probs
    order = mx.argsort(-probs, axis=-1)
    sorted_probs = mx.take_along_axis(probs, order, axis=-1)
    before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass of strictly more likely tokens
    keep_sorted = before < p  # the top token always stays (before == 0)
    keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
    return mx.where(keep, probs, 0.0)


def _mask_min_p(probs: mx.array, min_p: float) -> mx.array:
    if min_p <= 0:
        return probs
    threshold = min_p * mx.max(probs, axis=-1, keepdims=True)
    return mx.where(probs >= threshold, probs, 0.0)


def distribution(logits: mx.array, params: SamplingParams, recent: mx.array | None = None) -> mx.array:
    """The probabilities the next token is drawn from, shape like ``logits`` (..., V).

    Order: repetition penalty, temperature, then the top-k, top-p and min-p
    masks, then renormalisation. At temperature 0 the result is one-hot on the argmax.
    """
    logits = penalize_repeats(logits.astype(mx.float32), recent, params.repetition_penalty)
    if params.greedy:
        best = mx.argmax(logits, axis=-1, keepdims=True)
        return mx.put_along_axis(mx.zeros_like(logits), best, mx.array(1.0), axis=-1)
    probs = mx.softmax(logits / params.temperature, axis=-1)
    probs = _mask_min_p(_mask_top_p(_mask_top_k(probs, params.top_k), params.top_p), params.min_p)
    return probs / mx.sum(probs, axis=-1, keepdims=True)


def greedy_token(logits: mx.array, params: SamplingParams, recent: mx.array | None = None) -> mx.array:
    """Argmax after the repetition penalty: the greedy path, without building a distribution."""
    return mx.argmax(penalize_repeats(logits, recent, params.repetition_penalty), axis=-1)


def draw(probs: mx.array, key: mx.array) -> mx.array:
    """One token id per row of ``probs`` (..., V), drawn with the random ``key``."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=key)


class KeyStream:
    """A reproducible sequence of random keys: same seed, same draws."""

    def __init__(self, seed: int | None) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        self._key = mx.random.key(seed)

    def next(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub
