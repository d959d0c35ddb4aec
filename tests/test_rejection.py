"""Rejection sampling on toy distributions: emitted tokens follow the target's distribution."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
from scipy.stats import chisquare

from mlxcore.rejection import verify, verify_greedy
from mlxcore.sampling import KeyStream, draw

P = np.array([0.5, 0.3, 0.15, 0.05])
Q = np.array([0.1, 0.2, 0.3, 0.4])  # a draft that mostly disagrees


def first_token_counts(p_rows, q_rows, trials, seed):
    """Draft k tokens from q, verify against p; count the first emitted token."""
    keys = KeyStream(seed)
    k = q_rows.shape[0]
    counts = np.zeros(p_rows.shape[1], dtype=np.int64)
    accepted_total = 0
    p, q = mx.array(p_rows, dtype=mx.float32), mx.array(q_rows, dtype=mx.float32)
    for _ in range(trials):
        drafted = mx.stack([draw(q[i], keys.next()) for i in range(k)])
        n, nxt = verify(p, q, drafted, keys.next())
        n = n.item()
        first = drafted[0].item() if n > 0 else nxt.item()
        counts[first] += 1
        accepted_total += n
    return counts, accepted_total / trials


def test_first_emitted_token_follows_p_whatever_q():
    """6,000 rounds, fixed seed; chi-square p-value must exceed 0.001."""
    counts, _ = first_token_counts(np.stack([P, P]), Q[None], 6000, seed=5)
    assert chisquare(counts, P * counts.sum()).pvalue > 1e-3, counts


def test_second_token_follows_p_given_the_first():
    """Two draft positions: the token after an accepted first one also follows p (chi-square, p > 0.001)."""
    p2 = np.array([0.1, 0.6, 0.2, 0.1])
    keys, counts = KeyStream(9), np.zeros(4, dtype=np.int64)
    p = mx.array(np.stack([P, p2, P]), dtype=mx.float32)
    q = mx.array(np.stack([Q, Q]), dtype=mx.float32)
    for _ in range(8000):
        drafted = mx.stack([draw(q[i], keys.next()) for i in range(2)])
        n, nxt = verify(p, q, drafted, keys.next())
        if n.item() >= 1:  # the first draft was accepted: what comes second?
            second = drafted[1].item() if n.item() == 2 else nxt.item()
            counts[second] += 1
    assert counts.sum() > 1000
    assert chisquare(counts, p2 * counts.sum()).pvalue > 1e-3, counts


def test_identical_distributions_accept_everything():
    _, mean_accepted = first_token_counts(np.stack([P, P, P]), np.stack([P, P]), 300, seed=1)
    assert mean_accepted == 2.0


def test_acceptance_rate_is_overlap_of_p_and_q():
    """P(accept) = sum min(p, q) = 0.1 + 0.2 + 0.15 + 0.05 = 0.5 (3,000 rounds, within 0.04)."""
    _, mean_accepted = first_token_counts(np.stack([P, P]), Q[None], 3000, seed=2)
    assert abs(mean_accepted - 0.5) < 0.04


def test_greedy_keeps_the_matching_run_and_takes_the_target_argmax():
    n, nxt = verify_greedy(mx.array([4, 7, 1, 9]), mx.array([4, 7, 2]))
    assert (n.item(), nxt.item()) == (2, 1)
    n, nxt = verify_greedy(mx.array([4, 7, 2, 9]), mx.array([4, 7, 2]))
    assert (n.item(), nxt.item()) == (3, 9)
    n, nxt = verify_greedy(mx.array([5, 7, 2, 9]), mx.array([4, 7, 2]))
    assert (n.item(), nxt.item()) == (0, 5)
