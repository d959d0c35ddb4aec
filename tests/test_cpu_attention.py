"""CPU prefill's blocked causal attention against a float64 NumPy reference, at the blocking's boundaries."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest

from mlxcore.cpu_attention import MIN_KEYS_PER_BLOCK, QUERIES_PER_PASS, SCORES_PER_BLOCK, segmented_causal_attention

HEADS, KV_HEADS, DIM = 32, 8, 16  # the 8B's 32 query heads over 8 KV heads (the blocking ignores the head size)
ROWS = HEADS // KV_HEADS * QUERIES_PER_PASS  # queries per KV head in a full chunk
KEYS = max(MIN_KEYS_PER_BLOCK, SCORES_PER_BLOCK // ROWS)  # keys per block for a full chunk


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Causal softmax attention in float64; the queries are the last positions."""
    n, s = q.shape[2], k.shape[2]
    k, v = (np.repeat(x, q.shape[1] // x.shape[1], axis=1) for x in (k, v))
    scores = q @ k.swapaxes(-1, -2) * scale
    scores = np.where(np.arange(s)[None] <= np.arange(n)[:, None] + (s - n), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


@pytest.mark.parametrize("queries,keys", [
    (QUERIES_PER_PASS, QUERIES_PER_PASS),  # a first chunk: several KV heads share one block
    (QUERIES_PER_PASS, SCORES_PER_BLOCK // (ROWS * 3)),  # 3 KV heads a block: 8 heads split 3, 3, 2
    (QUERIES_PER_PASS, KEYS),  # one KV head's keys fill exactly one block
    (QUERIES_PER_PASS, KEYS + 1),  # two blocks, the first one key long
    (QUERIES_PER_PASS, 3 * KEYS + 100),  # four blocks; only the last holds masked keys
    (5, 3000),  # a short tail chunk: fewer queries, longer blocks
    (2 * QUERIES_PER_PASS + 44, 700),  # a chunk longer than a pass: three passes, each to its own keys
])
def test_matches_float64_reference(queries, keys):
    rng = np.random.default_rng(queries * 10_000 + keys)
    q, k, v = (rng.standard_normal((1, h, n, DIM)).astype(np.float32)
               for h, n in ((HEADS, queries), (KV_HEADS, keys), (KV_HEADS, keys)))
    scale = DIM ** -0.5
    ours = np.array(segmented_causal_attention(mx.array(q), [(mx.array(k), mx.array(v))], scale))
    expected = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale)
    # Outputs are weighted means of unit-normal values: float32 rounding of scores, exps and sums
    # left both ours and MLX's own attention within 1e-6 of float64 on these inputs.
    np.testing.assert_allclose(ours, expected, rtol=0, atol=2e-6, err_msg=f"{queries} queries, {keys} keys")
