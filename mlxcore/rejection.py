"""Speculative rejection sampling: which draft tokens the target keeps, and the token after them.

Notation as in the papers: ``p`` is the target's distribution, ``q`` the draft's,
both from the same ``sampling.distribution`` transform.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.sampling import draw


def verify(p: mx.array, q: mx.array, drafted: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
    """Accept a prefix of ``drafted`` and choose the token that follows it.

    p: (k + 1, V) target distributions after each of the k draft positions and one more;
    q: (k, V) the draft distributions the k tokens were drawn from; drafted: (k,) ids.
    Token i is accepted with probability min(1, p_i[d_i] / q_i[d_i]); the first
    rejection ends the run and the next token is drawn from normalize(max(p_i - q_i, 0));
    if all k pass, a bonus token is drawn from p_k. The emitted tokens then follow p exactly.

    Returns (accepted count n as a () array, the next token as a () array), both lazy."""
    k = drafted.shape[0]
    u_key, draw_key = mx.random.split(key)
    rows = mx.arange(k)
    p_d, q_d = p[rows, drafted], q[rows, drafted]  # (k,)
    u = mx.random.uniform(shape=(k,), key=u_key)
    accepted = u * q_d < p_d  # u < p/q without dividing by a zero q
    n = mx.sum(mx.cumprod(accepted.astype(mx.int32)))  # length of the accepted run
    residual = mx.maximum(p[:k] - q, 0.0)  # (k, V)
    residual = mx.concatenate([residual, p[k:]], axis=0)  # row k: the bonus distribution
    row = residual[n]
    total = mx.sum(row)
    # All-zero residual only when p == q at that row; then p itself is the right distribution.
    row = mx.where(total > 0, row / mx.maximum(total, 1e-30), p[n])
    return n, draw(row, draw_key)


def verify_greedy(target_argmax: mx.array, drafted: mx.array) -> tuple[mx.array, mx.array]:
    """Temperature 0: keep drafts while they equal the target's argmax; the next token is its argmax.
    target_argmax: (k + 1,) ids; drafted: (k,) ids."""
    k = drafted.shape[0]
    n = mx.sum(mx.cumprod((target_argmax[:k] == drafted).astype(mx.int32)))
    return n, target_argmax[n]
