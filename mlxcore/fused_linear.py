"""Several linear layers that read the same input as one matrix product: q, k, v; and the MLP's gate and up.

A decode step of a small model is mostly operation count, and each projection
is one. The layers' weights (and, quantized, their scales and biases) are
joined row-wise into one matrix once; each layer's own parameters then become
views of their rows of it, so the model's modules still work (prefill goes
through them) and no memory is added. Float ``nn.Linear`` and ``nn.QuantizedLinear``
of one format join; anything else (a bias, mixed formats) stays unjoined.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

_QUANTIZED = ("weight", "scales", "biases")


class FusedLinear:
    """``fused(x)`` -> the outputs of ``layers`` on ``x``, in order, from one product."""

    def __init__(self, layers: list[nn.Module]) -> None:
        self.quantized = isinstance(layers[0], nn.QuantizedLinear)
        names = [n for n in _QUANTIZED if n in layers[0]] if self.quantized else ["weight"]
        sizes = [layer.weight.shape[0] for layer in layers]
        self.ends = list(itertools.accumulate(sizes))[:-1]
        self.parts = {name: mx.concatenate([layer[name] for layer in layers], axis=0) for name in names}
        mx.eval(self.parts)
        starts = [0, *self.ends]
        for layer, start, size in zip(layers, starts, sizes):  # the layers' own parameters become views
            layer.update({name: joined[start:start + size] for name, joined in self.parts.items()})
        mx.eval([layer.parameters() for layer in layers])
        if self.quantized:
            first = layers[0]
            self.format = {"group_size": first.group_size, "bits": first.bits, "mode": first.mode}

    def __call__(self, x: mx.array) -> list[mx.array]:
        if self.quantized:
            out = mx.quantized_matmul(x, self.parts["weight"], scales=self.parts["scales"],
                                      biases=self.parts.get("biases"), transpose=True, **self.format)
        else:
            out = x @ self.parts["weight"].T
        return mx.split(out, self.ends, axis=-1)  # type: ignore[return-value]  # mlx's stub says array: a list


def fusable(layers: list[nn.Module]) -> bool:
    """Whether ``layers`` can be joined: all float ``nn.Linear`` or all quantized alike, none with a bias."""
    if any("bias" in layer for layer in layers):
        return False
    if all(type(layer) is nn.Linear for layer in layers):
        return len({layer.weight.dtype for layer in layers}) == 1
    if all(isinstance(layer, nn.QuantizedLinear) for layer in layers):
        return len({(layer.group_size, layer.bits, layer.mode, "biases" in layer) for layer in layers}) == 1
    return False


def fuse(layers: list[nn.Module]) -> Callable[[mx.array], list[mx.array]]:
    """A ``FusedLinear`` of ``layers`` when they can be joined; else a function calling each (same result)."""
    if fusable(layers):
        return FusedLinear(layers)
    return lambda x: [layer(x) for layer in layers]
