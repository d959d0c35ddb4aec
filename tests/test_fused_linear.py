"""Joined projections give each layer's own output, float and 4-bit, and add no memory."""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxcore.fused_linear import FusedLinear, fuse, fusable


def layers(quantized: bool, bias: bool = False) -> list[nn.Module]:
    mx.random.seed(3)
    made = [nn.Linear(256, size, bias=bias) for size in (256, 64, 64)]
    if quantized:
        made = [nn.QuantizedLinear.from_linear(layer, group_size=64, bits=4) for layer in made]
    mx.eval([layer.parameters() for layer in made])
    return made


@pytest.mark.parametrize("quantized", [False, True])
def test_joined_outputs_equal_each_layers_own(quantized):
    made = layers(quantized)
    x = mx.random.normal((3, 5, 256))
    expected = [np.array(layer(x)) for layer in made]
    mx.synchronize()
    before = mx.get_active_memory()
    fused = fuse(made)
    assert isinstance(fused, FusedLinear)
    mx.synchronize()
    assert mx.get_active_memory() - before < 4096, "the layers' parameters are views of the joined ones"
    for got, want in zip(fused(x), expected):
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)
    for layer, want in zip(made, expected):  # the modules themselves still work, on the views
        np.testing.assert_allclose(np.array(layer(x)), want, rtol=1e-5, atol=1e-5)


def test_layers_with_a_bias_or_mixed_formats_are_left_alone():
    assert not fusable(layers(False, bias=True))
    mixed = layers(False)[:2] + layers(True)[2:]
    assert not fusable(mixed)
    x = mx.random.normal((2, 256))
    outputs = fuse(mixed)(x)
    for got, layer in zip(outputs, mixed):
        assert mx.array_equal(got, layer(x)).item()
