"""Sampling in two steps: logits -> probability distribution, then draw.

Speculative decoding compares the target's and the draft's distributions, so
both go through exactly the same ``distribution`` transform. Temperature 0 is a
true greedy path: ``distribution`` returns a one-hot vector and ``next_token``
an argmax, with no division by a tiny temperature.

The masks keep every token at least as likely as a threshold, so tokens of
equal probability are always kept or dropped together:
- top-k: the k-th largest probability (tokens tied with it are all kept, so
  more than k may stay);
- top-p: the probability of the last token, in descending order, whose more
  likely predecessors hold less than p of the mass (ties with it are all kept);
- min-p: min_p x the top probability (compared as logits: z >= max z + log min_p).
The result is the intersection of the three, renormalised. Top-p mass is the
full distribution's (after temperature, before top-k), so the masks commute.
``next_token`` draws from exactly this distribution (to float32 rounding),
without building it when it need not (how, at Qwen3's vocabulary: ``sampling_graphs``).
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.params import SamplingParams
from mlxcore.sampling_graphs import greedy_pick, gumbel_max, sampled_pick, transform
from mlxcore.seeds import fresh_seed


def penalize_repeats(logits: mx.array, recent: mx.array | None, penalty: float) -> mx.array:
    """Make tokens in ``recent`` less likely: positive logits / penalty, negative ones x penalty.
    logits: (..., V); recent: (n,) token ids."""
    if recent is None or recent.size == 0 or penalty == 1.0:
        return logits
    seen = mx.zeros(logits.shape[-1], dtype=mx.int32)
    seen[recent] = 1
    scaled = mx.where(logits > 0, logits / penalty, logits * penalty)
    return mx.where(seen.astype(mx.bool_), scaled, logits)


def distribution(logits: mx.array, params: SamplingParams, recent: mx.array | None = None) -> mx.array:
    """The probabilities the next token is drawn from, float32, shape like ``logits`` (..., V).

    Order: repetition penalty, temperature, then the top-k, top-p and min-p
    masks (see the module docstring), then renormalisation. At temperature 0
    the result is one-hot on the argmax."""
    logits = penalize_repeats(logits.astype(mx.float32), recent, params.repetition_penalty)
    if params.greedy:
        best = mx.argmax(logits, axis=-1, keepdims=True)
        return mx.put_along_axis(mx.zeros_like(logits), best, mx.array(1.0), axis=-1)
    fn, scalars = transform(params)
    probs: mx.array = fn(logits, *scalars)
    return probs


def draw(probs: mx.array, key: mx.array) -> mx.array:
    """One token id per row of ``probs`` (..., V), drawn with the random ``key``."""
    return gumbel_max(mx.log(probs), key)


def next_token(logits: mx.array, params: SamplingParams, key: mx.array | None,
               recent: mx.array | None = None) -> tuple[mx.array, mx.array]:
    """(token (...,), its log-probability (...,)) from logits (..., V), as lazy arrays.

    The token is the argmax after the repetition penalty, or a ``draw`` from ``distribution`` with
    ``key``, in one compiled graph. The log-probability is the model's own
    (temperature 1, no masks, no penalty)."""
    if params.greedy:
        picked: tuple[mx.array, mx.array] = greedy_pick()(penalize_repeats(logits, recent, params.repetition_penalty),
                                                            logits)
        return picked
    chosen = penalize_repeats(logits.astype(mx.float32), recent, params.repetition_penalty)  # as ``distribution``
    fn, scalars = sampled_pick([params])  # one key draws every row (a reply's, or a test's block)
    rows, shape = (-1, logits.shape[-1]), logits.shape[:-1]
    token, logprob = fn(chosen.reshape(rows), logits.reshape(rows), key, *scalars)
    return token.reshape(shape), logprob.reshape(shape)


def warm_up(logits: mx.array) -> None:
    """Build the compiled sampling graphs a reply at Qwen3's recommended settings, or greedy, uses,
    for logits like ``logits`` (1, V): plain steps, draft rows (V,) and verification blocks (2, V).
    On Linux the first build of each runs the C++ compiler (seconds); afterwards MLX's disk cache has them."""
    key = mx.random.key(0)
    for params in (SamplingParams(), SamplingParams(temperature=0.6, top_k=20, top_p=0.95)):
        mx.eval(next_token(logits, params, key),
                distribution(logits[0], params), distribution(mx.concatenate([logits, logits]), params))


class KeyStream:
    """A reproducible sequence of random keys: same seed, same draws."""

    def __init__(self, seed: int | None) -> None:
        self._key = mx.random.key(fresh_seed() if seed is None else seed)

    def next(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub


class TokenPicker:
    """Chooses a reply's next token from logits (1, V); keeps the recent ids for the repetition penalty."""

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
