"""fast_exp, fast_softmax and fast_silu against float64 NumPy references."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np

from mlxcore.fast_exp import _exp_parts, fast_exp, fast_silu, fast_softmax


def test_exp_is_within_float32_rounding_over_its_range():
    x = np.linspace(-80, 80, 400_001, dtype=np.float32)
    ours = np.array(fast_exp(mx.array(x)), dtype=np.float64)
    relative = np.abs(ours - np.exp(x.astype(np.float64))) / np.exp(x.astype(np.float64))
    assert relative.max() < 3e-7  # float32's unit roundoff is 6e-8; MLX's own exp is off by up to ~4e-6 here


def test_exp_clips_outside_its_range_and_never_gives_inf_nan_or_denormals():
    out = np.array(fast_exp(mx.array([-np.inf, -1000.0, 1000.0, np.inf], dtype=mx.float32)))
    np.testing.assert_allclose(out, np.exp(np.array([-80, -80, 80, 80], dtype=np.float64)), rtol=3e-7)
    assert np.all(np.isfinite(out)) and np.all(out >= np.finfo(np.float32).tiny)


def test_softmax_matches_numpy_with_masked_entries():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 7, 50)) * 6).astype(np.float32)
    x[..., 30:] = -np.inf  # masked keys, as causal attention has
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    reference = e / e.sum(axis=-1, keepdims=True)
    ours = np.array(fast_softmax(mx.array(x)))
    # rtol: x - max is rounded to float32 first; at |x - max| ~ 40 that alone moves exp by ~2e-6
    np.testing.assert_allclose(ours, reference, rtol=3e-6, atol=1e-30)
    assert np.all(ours[..., 30:] < 1e-30)


def test_silu_matches_numpy_including_large_magnitudes():
    x = np.concatenate([np.linspace(-12, 12, 10_001), [-200.0, -90.0, 90.0, 200.0]]).astype(np.float32)
    x64 = x.astype(np.float64)
    reference = x64 / (1 + np.exp(-x64))
    ours = np.array(fast_silu(mx.array(x)), dtype=np.float64)
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-30)


def test_the_fused_kernel_gives_the_unfused_values():
    x = mx.array(np.linspace(-90, 90, 100_001, dtype=np.float32)).reshape(1, 1, 1, 1, -1)
    p, bits = _exp_parts(x)  # the plain ops, one pass each
    assert mx.array_equal(fast_exp(x), p * bits.view(mx.float32)).item()
