"""Sampling: the masks on crafted logits, the greedy path, and seeded draws against the intended distribution."""

import math

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from mlxcore.params import GenerationParams, SamplingParams
from mlxcore.sampling import KeyStream, distribution, draw, next_token, penalize_repeats

LOGITS = mx.array([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


def probs_of(params: SamplingParams, logits=LOGITS, recent=None) -> np.ndarray:
    return np.array(distribution(logits, params, recent))[0]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_greedy_is_one_hot_on_argmax():
    p = probs_of(SamplingParams(temperature=0))
    assert p.tolist() == [1, 0, 0, 0, 0, 0]
    assert next_token(LOGITS, SamplingParams(), None)[0].item() == 0


def test_temperature_scales_logits():
    p = probs_of(SamplingParams(temperature=0.5))
    np.testing.assert_allclose(p, softmax(np.array(LOGITS)[0] / 0.5), rtol=1e-5)


def test_top_k_keeps_exactly_k():
    p = probs_of(SamplingParams(temperature=1, top_k=3))
    full = softmax(np.array(LOGITS)[0])
    np.testing.assert_allclose(p[:3], full[:3] / full[:3].sum(), rtol=1e-5)
    assert (p[3:] == 0).all()


def test_top_p_keeps_smallest_set_reaching_p():
    full = softmax(np.array(LOGITS)[0])  # ~[0.57, 0.21, 0.13, 0.08, 0.03, 0.004]
    for top_p, kept in [(0.5, 1), (0.6, 2), (0.8, 3), (0.99, 5), (1.0, 6)]:
        p = probs_of(SamplingParams(temperature=1, top_p=top_p))
        assert (p > 0).sum() == kept, (top_p, p)
        np.testing.assert_allclose(p[:kept], full[:kept] / full[:kept].sum(), rtol=1e-5)
        assert np.cumsum(full)[kept - 1] >= top_p - 1e-6


def test_min_p_drops_tokens_below_fraction_of_top():
    full = softmax(np.array(LOGITS)[0])
    p = probs_of(SamplingParams(temperature=1, min_p=0.2))
    keep = full >= 0.2 * full.max()
    assert ((p > 0) == keep).all()
    np.testing.assert_allclose(p[keep], full[keep] / full[keep].sum(), rtol=1e-5)


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    out = penalize_repeats(mx.array([2.0, -1.0, 3.0]), mx.array([0, 1]), 2.0)
    assert out.tolist() == [1.0, -2.0, 3.0]
    p = probs_of(SamplingParams(temperature=0, repetition_penalty=4.0), recent=mx.array([0]))
    assert p.argmax() == 1  # 2.0 / 4 = 0.5 < 1.0


def test_invalid_params_say_what_is_wrong():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        GenerationParams(max_tokens=0)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=4),
                                    SamplingParams(temperature=1.3, top_p=0.9, min_p=0.02)])
def test_seeded_draws_follow_the_distribution(params):
    """Chi-square goodness of fit, 20,000 draws, fixed seed; fails if p < 0.001."""
    expected = probs_of(params)
    support = expected > 0
    keys = KeyStream(1234)
    probs = mx.broadcast_to(mx.array(expected)[None], (20_000, expected.size))
    counts = np.bincount(np.array(draw(probs, keys.next())), minlength=expected.size)
    assert counts[~support].sum() == 0  # masked tokens are never drawn
    target = expected[support].astype(np.float64)
    result = chisquare(counts[support], target / target.sum() * counts.sum())
    assert result.pvalue > 1e-3, (counts, expected)


def test_same_seed_same_draws_other_seed_other_draws():
    probs = mx.broadcast_to(distribution(LOGITS, SamplingParams(temperature=1.0)), (64, 6))
    a, b, c = (np.array(draw(probs, KeyStream(s).next())) for s in (7, 7, 8))
    assert (a == b).all() and not (a == c).all()
    assert math.isfinite(float(mx.sum(probs)))
