"""The compiled graphs behind ``sampling``: the masking transform and the per-step token pick.

At a 151,936-token vocabulary each whole-vocabulary operation costs about a layer of a small model on the
CPU, so the sampler touches the vocabulary few times (docs/decisions.md, "Sampling at Qwen3's vocabulary"):
one graph per mask combination, cached, with temperature, p and min-p as arrays (one row per sequence, so
rows that share the masks sample in one graph); each row draws with its own key (its reply's seed), so a
row draws the same in a batch as alone; the reported log-probability's log-sum-exp goes through
``fast_exp`` where the device profile says so. ``MLXCHAT_COMPILE=0`` (or a platform where compiling fails)
runs the same graphs uncompiled.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import mlx.core as mx

from mlxcore.compile_support import compile_works
from mlxcore.device_profile import current
from mlxcore.fast_exp import fast_exp
from mlxcore.params import SamplingParams

# Top-k up to this draws by inverse CDF: its rounding (~6e-8 a kept token) stays below ~2e-5 in all.
FEW_TOKENS = 256
Scalars = tuple[mx.array, mx.array, mx.array]  # temperature, top_p, min_p: float32 (rows, 1), a row a sequence


def _compiled(fn: Callable) -> Callable:
    return mx.compile(fn) if compile_works() else fn


class Masks(NamedTuple):
    """Which masks a parameter set turns on: the shape of its graph."""

    top_k: int  # 0 = off
    nucleus: bool  # top-p < 1
    floor: bool  # min-p > 0


def _masks(params: SamplingParams) -> Masks:
    return Masks(params.top_k, params.top_p < 1.0, params.min_p > 0.0)


def _active_k(masks: Masks, vocab: int) -> int:
    return masks.top_k if 0 < masks.top_k < vocab else 0


def _threshold(probs: mx.array, k: int, nucleus: bool, top_p: mx.array) -> mx.array:
    """(..., 1): top-k and top-p keep the tokens with probs >= this."""
    if k:
        candidates = mx.topk(probs, k, axis=-1)  # the k largest (in no set order)
    else:
        # Top-p alone. A token below (1 - p) / V has less than 1 - p of the mass at or below it, so
        # more than p above it: it is never kept. Zeroing those changes no kept token's prefix,
        # and a sort of mostly zeros is quicker (docs/decisions.md, "Sampling at Qwen3's vocabulary").
        floor = (1.0 - top_p) / (2 * probs.shape[-1])  # half that bound: room for float32 rounding
        candidates = mx.where(probs >= floor, probs, 0.0)
    ranked = -mx.sort(-candidates, axis=-1)  # descending
    if not nucleus:
        return ranked[..., k - 1 : k]
    before = mx.cumsum(ranked, axis=-1) - ranked  # mass of the tokens ranked above each one
    count = mx.sum(before < top_p, axis=-1, keepdims=True)  # >= 1: the top token has before == 0
    threshold = mx.take_along_axis(ranked, count - 1, axis=-1)
    # Only if rounding put the candidates' mass below p (p within ~1e-5 of 1) would a zero be reached.
    return threshold if k else mx.maximum(threshold, floor)


def _keep(z: mx.array, probs: mx.array | None, masks: Masks, top_p: mx.array, min_p: mx.array) -> mx.array | None:
    """Which tokens the masks keep, (..., V) bool, or None when none is on.
    z: logits / temperature; probs: softmax(z), needed (not None) for top-k and top-p."""
    keep = None
    k = _active_k(masks, z.shape[-1])
    if k or masks.nucleus:
        assert probs is not None, "top-k and top-p need the probabilities"
        keep = probs >= _threshold(probs, k, masks.nucleus, top_p)
    if masks.floor:  # p >= min_p * max(p)  <=>  z >= max(z) + log(min_p): no exp over the vocabulary
        above = z >= mx.max(z, axis=-1, keepdims=True) + mx.log(min_p)
        keep = above if keep is None else keep & above
    return keep


def _masked_distribution(logits: mx.array, scalars: Scalars, masks: Masks) -> mx.array:
    temperature, top_p, min_p = scalars
    z = logits / temperature
    probs = mx.softmax(z, axis=-1)
    keep = _keep(z, probs, masks, top_p, min_p)
    kept = probs if keep is None else mx.where(keep, probs, 0.0)
    return kept / mx.sum(kept, axis=-1, keepdims=True)


def _log_normalizer(logits: mx.array, fast: bool) -> mx.array:
    """log(sum(exp(logits))) over the last axis, float32, (...,); ``fast``: by ``fast_exp``."""
    logits = logits.astype(mx.float32)
    if not fast:
        return mx.logsumexp(logits, axis=-1)
    top = mx.max(logits, axis=-1, keepdims=True)
    return (top + mx.log(mx.sum(fast_exp(logits - top), axis=-1, keepdims=True)))[..., 0]


def _logprob(logits: mx.array, token: mx.array, fast: bool) -> mx.array:
    picked = mx.take_along_axis(logits, token[..., None], axis=-1)[..., 0].astype(mx.float32)
    return picked - _log_normalizer(logits, fast)


@lru_cache(maxsize=64)
def _scalars(temperature: float, top_p: float, min_p: float) -> Scalars:
    t, p, m = (mx.array(v, dtype=mx.float32) for v in (temperature, top_p, min_p))
    return t, p, m


@lru_cache(maxsize=64)
def _row_scalars(rows: tuple[tuple[float, float, float], ...]) -> Scalars:
    """(temperature, top_p, min_p) of each row as (rows, 1) arrays."""
    t, p, m = (mx.array([[row[i]] for row in rows], dtype=mx.float32) for i in range(3))
    return t, p, m


@lru_cache(maxsize=16)
def _transform_graph(masks: Masks) -> Callable:
    return _compiled(lambda logits, *scalars: _masked_distribution(logits, scalars, masks))


def transform(params: SamplingParams) -> tuple[Callable, Scalars]:
    """``(fn, scalars)``: ``fn(float32 logits (..., V), *scalars)`` -> the masked distribution (..., V)."""
    return _transform_graph(_masks(params)), _scalars(params.temperature, params.top_p, params.min_p)


def greedy_pick() -> Callable:
    """``fn(chosen, logits)`` -> (argmax of chosen, log-probability of it under logits)."""
    return _greedy_graph(current().fast_exp)


@lru_cache(maxsize=2)
def _greedy_graph(fast: bool) -> Callable:
    def pick(chosen: mx.array, logits: mx.array) -> tuple[mx.array, mx.array]:
        token = mx.argmax(chosen, axis=-1)
        return token, _logprob(logits, token, fast)
    return _compiled(pick)


def _row_noise(draw: Callable, keys: mx.array, rows: int, width: int) -> mx.array:
    """(rows, width) random numbers by ``draw`` (mx.random.uniform or gumbel): from one key (2,) for them all,
    or row i from ``keys[i]`` (rows, 2), so that a row drawn alone with key k draws the same in a batch."""
    if keys.ndim == 1:
        noise: mx.array = draw(shape=(rows, width), key=keys)
        return noise
    parts = [draw(shape=(1, width), key=keys[i]) for i in range(rows)]
    return parts[0] if rows == 1 else mx.concatenate(parts)


def gumbel_max(scores: mx.array, keys: mx.array) -> mx.array:
    """A token per row of ``scores`` (rows, V) or (V,), drawn with chance proportional to exp(score):
    the argmax of scores plus Gumbel noise (``_row_noise``'s keys)."""
    rows = scores.reshape(-1, scores.shape[-1])
    drawn = mx.argmax(rows + _row_noise(mx.random.gumbel, keys, *rows.shape), axis=-1)
    return drawn.reshape(scores.shape[:-1])


def _inverse_cdf_draw(probs: mx.array, keys: mx.array) -> mx.array:
    """One index per row of ``probs`` (rows, V), chosen with chance proportional to its entry.

    One uniform per row (``_row_noise``'s keys) against the running sum: each token's chance is its
    share up to float32 rounding of that sum (~6e-8 per nonzero entry), so use
    it where few entries are nonzero. ``mx.random.categorical`` needs a random
    number and two logs per entry, which costs more at 151,936 entries."""
    cdf = mx.cumsum(probs, axis=-1)  # nondecreasing: both tests below are False, then True
    total = cdf[..., -1:]
    target = _row_noise(mx.random.uniform, keys, probs.shape[0], 1) * total
    # cdf >= total: u * total may round up to total; then the last nonzero entry is chosen
    return mx.sum(~((cdf > target) | (cdf >= total)), axis=-1)


def _draw(chosen: mx.array, keys: mx.array, scalars: tuple[mx.array, ...], masks: Masks) -> mx.array:
    """A token per row of ``chosen`` (rows, V) drawn from ``_masked_distribution(chosen, ...)`` with that row's
    key (``keys``: (rows, 2), or one (2,) for all), touching the vocabulary few times.

    Top-k up to FEW_TOKENS: inverse CDF over the kept probabilities. Otherwise
    Gumbel-max on the kept z = logits / temperature, which softmax would turn
    into those same probabilities: no softmax, and no log of it, unless top-k
    or top-p need the probabilities."""
    temperature, top_p, min_p = scalars
    z = chosen / temperature
    probs = mx.softmax(z, axis=-1) if _active_k(masks, z.shape[-1]) or masks.nucleus else None
    keep = _keep(z, probs, masks, top_p, min_p)
    if 0 < _active_k(masks, z.shape[-1]) <= FEW_TOKENS:
        assert keep is not None and probs is not None, "top-k keeps tokens by their probabilities"
        return _inverse_cdf_draw(mx.where(keep, probs, 0.0), keys)
    return gumbel_max(z if keep is None else mx.where(keep, z, -mx.inf), keys)


@lru_cache(maxsize=32)
def _sampled_graph(masks: Masks, fast: bool) -> Callable:
    def pick(chosen: mx.array, logits: mx.array, keys: mx.array, *scalars: mx.array) -> tuple[mx.array, mx.array]:
        token = _draw(chosen, keys, scalars, masks)
        return token, _logprob(logits, token, fast)
    return _compiled(pick)


def graph_of(params: SamplingParams) -> Masks | str:
    """What rows share one pick: "greedy" (one argmax), else the masks of their graph (``sampled_pick``)."""
    return "greedy" if params.greedy else _masks(params)


def sampled_pick(params: list[SamplingParams]) -> tuple[Callable, Scalars]:
    """``(fn, scalars)`` for rows sampled with ``params`` (one each, of one ``graph_of``):
    ``fn(chosen (rows, V), logits (rows, V), keys (rows, 2), *scalars)`` -> (a draw per row from the distribution
    of chosen, its log-probability under logits), each row as it would be alone (one key (2,): as a block)."""
    rows = tuple((p.temperature, p.top_p, p.min_p) for p in params)
    return _sampled_graph(_masks(params[0]), current().fast_exp), _row_scalars(rows)
