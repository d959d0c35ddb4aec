"""Sampling at Qwen3's 151,936 tokens: the compiled transform against NumPy and mlx-lm, ties, seeded draws."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p
from scipy.stats import chisquare

from mlxcore.params import SamplingParams
from mlxcore.sampling import KeyStream, distribution, draw, next_token
from mlxcore.sampling_graphs import _inverse_cdf_draw

VOCAB = 151_936
RECENT = np.array([3, 17, 17, 40_000, 151_935])  # ids the repetition penalty sees (a repeat included)


def numpy_probs(logits: np.ndarray, p: SamplingParams, recent=None) -> np.ndarray:
    """Penalty and temperature in float64: the distribution before any mask."""
    x = logits.astype(np.float64)
    if recent is not None and p.repetition_penalty != 1.0:
        seen = np.unique(recent)
        x[seen] = np.where(x[seen] > 0, x[seen] / p.repetition_penalty, x[seen] * p.repetition_penalty)
    e = np.exp((x - x.max()) / p.temperature)
    return e / e.sum()


def numpy_distribution(logits: np.ndarray, p: SamplingParams, recent=None) -> np.ndarray:
    """The documented transform in float64: every mask keeps the tokens at least as likely as its threshold."""
    probs = numpy_probs(logits, p, recent)
    ranked = np.sort(probs)[::-1]
    threshold = 0.0
    if 0 < p.top_k < VOCAB:
        threshold = ranked[p.top_k - 1]  # ties with the k-th are kept
    if p.top_p < 1.0:
        before = np.cumsum(ranked) - ranked  # mass ranked above each token
        threshold = max(threshold, ranked[np.count_nonzero(before < p.top_p) - 1])  # ties with the last kept too
    threshold = max(threshold, p.min_p * probs.max())
    kept = np.where(probs >= threshold, probs, 0.0)
    return kept / kept.sum()


def assert_same_distribution(got: np.ndarray, want: np.ndarray, probs: np.ndarray, top_p: float,
                             tolerance: float = 2e-4) -> None:
    """Total variation below ``tolerance``; kept sets equal but for tokens at top-p's cut.

    MLX sums the 151,936 float32 terms of softmax's normaliser one after
    another: up to ~2e-4 off at temperature 1 (so is ``mx.logsumexp``, and so
    was the sort-everything transform this one replaced). So the cumulative
    mass is off too, and which tail token (each ~1e-6 of the mass) is the
    last inside p can differ: only tokens with the mass ranked above them
    within ``tolerance`` of p may be kept by one side and not the other.
    """
    differ = np.flatnonzero((got > 0) != (want > 0))
    if differ.size:
        order = np.argsort(-probs, kind="stable")
        before = np.empty_like(probs)
        before[order] = np.cumsum(probs[order]) - probs[order]
        assert np.abs(before[differ] - top_p).max() < tolerance, f"{differ.size} tokens kept by one side only"
    assert 0.5 * np.abs(got - want).sum() < tolerance


def random_logits(seed: int, rows: int = 1, std: float = 4.0) -> np.ndarray:
    """Like the twins' logits: std 4 is peaked at this vocabulary (std 1 would be nearly uniform)."""
    return (np.random.default_rng(seed).standard_normal((rows, VOCAB)) * std).astype(np.float32)


CASES = [
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95),  # Qwen3's recommended sampling
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=2.0, top_p=0.8),  # flat: top-p alone keeps tens of thousands
    SamplingParams(temperature=1.0, top_p=0.99999),  # p within float32 rounding of the whole mass
    SamplingParams(temperature=1.3, min_p=0.05),
    SamplingParams(temperature=0.8, top_k=300, top_p=0.6, min_p=0.02),
    SamplingParams(temperature=2.0),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95, repetition_penalty=1.3),
]


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}"
                                                      f"-r{p.repetition_penalty}")
def test_distribution_matches_numpy(params):
    """Same distribution (``assert_same_distribution``); each probability within 1e-4 relative when no
    top-p cut falls in the tail (MLX's softmax sums 151,936 float32 terms: 2e-5 off at temperature 2)."""
    logits = random_logits(seed=params.top_k + 7)
    logits[0, RECENT[:2]] = logits.max() + [0.5, -0.2]  # penalised tokens near the top, so the penalty matters
    got = np.array(distribution(mx.array(logits), params, mx.array(RECENT)))[0]
    want = numpy_distribution(logits[0], params, RECENT)
    assert_same_distribution(got, want, numpy_probs(logits[0], params, RECENT), params.top_p)
    if params.top_p == 1.0 or params.top_k:  # no cut in the tail: the same tokens, each to float32 rounding
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-12)


@pytest.mark.parametrize("top_k,top_p,min_p", [(20, 1.0, 0.0), (0, 0.95, 0.0), (20, 0.9, 0.0), (40, 0.8, 0.05)])
def test_distribution_matches_mlx_lm_masks_at_temperature_one(top_k, top_p, min_p):
    """mlx-lm's own masks (its sampler applies temperature after them, so only T = 1 compares); no ties here."""
    logits = mx.array(random_logits(seed=11, rows=2))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if top_p < 1.0:
        logprobs = apply_top_p(logprobs, top_p)
    if min_p > 0:
        logprobs = apply_min_p(logprobs, min_p)
    if top_k:
        logprobs = apply_top_k(logprobs, top_k)
    theirs = np.array(mx.softmax(logprobs, axis=-1))
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    ours = np.array(distribution(logits, params))
    for row in range(2):  # mlx-lm's log-probabilities carry logsumexp's float32 error (~2e-4) once more
        assert_same_distribution(ours[row], theirs[row], numpy_probs(np.array(logits[row]), params), top_p, 5e-4)


def test_ties_at_the_k_th_value_and_at_the_top_p_cut_are_all_kept():
    """Equal logits are equal probabilities: the masks keep or drop them together, in any row layout."""
    logits = random_logits(seed=3)[0] - 20.0  # a far tail under the crafted head below
    head = [5.0, 3.0, 3.0, 3.0, 3.0, 2.0]  # token 0, then four tied ones
    ids = [900, 10, 150_000, 77_000, 4_242, 31]
    logits[ids] = head
    probs_top_k = np.array(distribution(mx.array(logits), SamplingParams(temperature=1.0, top_k=3)))
    assert set(np.flatnonzero(probs_top_k)) == set(ids[:5])  # the 3rd is tied with 3 more: 5 kept
    mass = np.exp(np.array(head) - 5.0) / np.exp(logits.astype(np.float64) - 5.0).sum()
    top_p = mass[0] + 1.5 * mass[1]  # the cut falls inside the tied group
    params = SamplingParams(temperature=1.0, top_p=float(top_p))
    probs_top_p = np.array(distribution(mx.array(logits), params))
    assert set(np.flatnonzero(probs_top_p)) == set(ids[:5])
    np.testing.assert_allclose(probs_top_p, numpy_distribution(logits, params), rtol=1e-5, atol=1e-12)
    # Rejection sampling compares a draft row (V,) with the target's rows (k + 1, V): same values either way.
    rows = mx.array(np.stack([logits, random_logits(seed=4)[0], logits]))
    for p in (SamplingParams(temperature=1.0, top_k=3), params, SamplingParams(temperature=0.6, top_k=20, top_p=0.95)):
        batched = distribution(rows, p)
        for i in range(3):
            assert mx.array_equal(batched[i], distribution(rows[i], p)).item()


def test_greedy_next_token_is_the_argmax_with_the_model_logprob():
    logits = random_logits(seed=5, rows=3)
    token, logprob = next_token(mx.array(logits), SamplingParams(temperature=0), None)
    assert np.array(token).tolist() == logits.argmax(axis=-1).tolist()
    x = mx.array(logits)
    mlx_logprob = mx.take_along_axis(x, token[:, None], axis=-1)[:, 0] - mx.logsumexp(x, axis=-1)
    np.testing.assert_allclose(np.array(logprob), np.array(mlx_logprob), atol=2e-6)  # the CPU's fast exp adds ~nothing
    x = logits.astype(np.float64)
    log_softmax = x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    # MLX sums 151,936 float32 terms one after another: ~2e-4 off, mx.logsumexp alike
    np.testing.assert_allclose(np.array(logprob), log_softmax[np.arange(3), logits.argmax(-1)], atol=1e-3)


@pytest.mark.parametrize("params,draw_of", [
    (SamplingParams(temperature=0.6, top_k=20, top_p=0.95, repetition_penalty=1.2), _inverse_cdf_draw),  # few tokens
    (SamplingParams(temperature=0.5, min_p=0.02), draw)])  # the whole vocabulary: sampling.draw
def test_next_token_draws_from_distribution(params, draw_of):
    """The compiled pick is ``draw_of(distribution(...), key)``: the same token for the same key
    (it draws from unnormalised weights, so a float32 rounding could tell them apart; none does here)."""
    logits, keys, recent = mx.array(random_logits(seed=12, rows=4, std=3.0)), KeyStream(5), mx.array(RECENT)
    logits[:, 17] = mx.max(logits, axis=-1)  # a penalised token at the top of every row
    for _ in range(3):
        key = keys.next()
        token, _ = next_token(logits, params, key, recent)
        assert mx.array_equal(token, draw_of(distribution(logits, params, recent), key)).item()


def test_inverse_cdf_draws_follow_the_distribution():
    """3,000 draws (fixed seed) at Qwen3's sampling: chi-square p > 0.001; masked tokens never drawn."""
    params = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    logits = random_logits(seed=8, std=3.0)
    expected = numpy_distribution(logits[0], params)
    probs = mx.contiguous(mx.broadcast_to(distribution(mx.array(logits), params), (250, VOCAB)))  # 250 draws a batch
    keys = KeyStream(2024)
    counts = sum(np.bincount(np.array(_inverse_cdf_draw(probs, keys.next())), minlength=VOCAB) for _ in range(12))
    assert counts[expected == 0].sum() == 0
    big = expected * counts.sum() >= 5  # chi-square wants expected counts of 5 or more: pool the rest
    observed, wanted = counts[big], expected[big] * counts.sum()
    if (~big & (expected > 0)).any():
        observed = np.append(observed, counts[~big].sum())
        wanted = np.append(wanted, expected[~big].sum() * counts.sum())
    assert chisquare(observed, wanted).pvalue > 1e-3, (observed, wanted)
