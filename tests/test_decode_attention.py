"""Attention over keys in segments (``decode_attention.attend``) against float64 NumPy and MLX's own attention."""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest

from mlxcore.decode_attention import attend


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, visible: np.ndarray) -> np.ndarray:
    """float64 softmax attention; q (1, H, L, D), k/v (1, KVH, S, D), visible (L, S) booleans."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1).astype(np.float64), np.repeat(v, rep, axis=1).astype(np.float64)
    scores = np.where(visible, q.astype(np.float64) @ k.swapaxes(-1, -2) * scale, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def pieces(array: mx.array, cuts: list[int]) -> list[mx.array]:
    bounds = [0, *cuts, array.shape[2]]
    return [array[:, :, a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("heads,kv_heads,n,cuts", [(6, 2, 1, []), (6, 2, 1, [100, 260]), (32, 8, 1, [1, 2, 300]),
                                                  (4, 4, 5, [150]), (6, 2, 7, [295]), (6, 2, 16, [1, 299])])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "additive"])
def test_segments_give_the_attention_of_the_whole(heads, kv_heads, n, cuts, mask_kind):
    rng = np.random.default_rng(heads * 100 + n)
    dim, keys, scale = 32, 300, 32 ** -0.5
    q = rng.normal(size=(1, heads, n, dim)).astype(np.float32)
    k, v = (rng.normal(size=(1, kv_heads, keys, dim)).astype(np.float32) for _ in range(2))
    causal = np.arange(keys)[None] <= np.arange(n)[:, None] + keys - n
    window = causal & (np.arange(keys)[None] > np.arange(n)[:, None] + keys - n - 50)  # a sliding window's mask
    visible, mask = {"none": (np.ones((n, keys), bool), None), "causal": (causal, "causal"),
                     "bool": (window, mx.array(window)),
                     "additive": (window, mx.array(np.where(window, 0.0, -np.inf).astype(np.float32))[None, None])
                     }[mask_kind]
    segments = list(zip(pieces(mx.array(k), cuts), pieces(mx.array(v), cuts)))
    ours = np.array(attend(mx.array(q), segments, scale, mask))
    np.testing.assert_allclose(ours, reference(q, k, v, scale, visible), atol=2e-6, rtol=1e-5)
    theirs = mx.fast.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v), scale=scale, mask=mask)
    np.testing.assert_allclose(ours, np.array(theirs), atol=2e-6, rtol=1e-5)


def test_bfloat16_keeps_its_dtype_and_agrees_to_its_precision():
    rng = np.random.default_rng(7)
    q = rng.normal(size=(1, 8, 1, 64)).astype(np.float32)
    k, v = (rng.normal(size=(1, 2, 200, 64)).astype(np.float32) for _ in range(2))
    as_bf16 = [mx.array(x).astype(mx.bfloat16) for x in (q, k, v)]
    segments = list(zip(pieces(as_bf16[1], [64, 128]), pieces(as_bf16[2], [64, 128])))
    ours = attend(as_bf16[0], segments, 0.125)
    assert ours.dtype == mx.bfloat16
    expected = reference(*(np.array(x.astype(mx.float32)) for x in as_bf16), 0.125, np.ones((1, 200), bool))
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)), expected, atol=2e-2)


def test_a_head_dependent_mask_takes_mlx_attention():
    rng = np.random.default_rng(8)
    q = mx.array(rng.normal(size=(1, 4, 2, 16)).astype(np.float32))
    k = v = mx.array(rng.normal(size=(1, 2, 10, 16)).astype(np.float32))
    mask = mx.array(rng.random((1, 4, 2, 10)) > 0.3)
    mask[..., -1] = True  # every row sees a key
    ours = attend(q, [(k[:, :, :4], v[:, :, :4]), (k[:, :, 4:], v[:, :, 4:])], 0.25, mask)
    theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    np.testing.assert_allclose(np.array(ours), np.array(theirs), atol=1e-6)
