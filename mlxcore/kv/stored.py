"""Keys (or values) as a cache stores them: one float array, or quantized parts (packed, scales, biases).

Every part is (1, kv_heads, tokens, width), tokens on axis 2, so slicing,
joining and writing tokens is the same for each part. mlx-lm's quantized
attention and ``decode_attention`` take the parts as a tuple.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcore.kv.errors import CacheShapeError
from mlxcore.kv.geometry import KVGeometry
from mlxcore.kv.kv_format import KVFormat
from mlxcore.kv.protocol import Stored

__all__ = ["Stored"]


def _parts(value: Stored) -> tuple[mx.array, ...]:
    return value if isinstance(value, tuple) else (value,)


def _like(value: Stored, parts: Sequence[mx.array]) -> Stored:
    return tuple(parts) if isinstance(value, tuple) else parts[0]


def encode(x: mx.array, fmt: KVFormat) -> Stored:
    """Float keys or values (1, kv_heads, n, head_dim) as ``fmt`` stores them."""
    if not fmt.quantized:
        return x
    return tuple(mx.quantize(x, group_size=fmt.group_size, bits=fmt.bits))


def zeros(geometry: KVGeometry, tokens: int) -> Stored:
    """Empty slots for ``tokens`` tokens in the geometry's format."""
    g, fmt = geometry, geometry.format
    if fmt.bits is None:
        return mx.zeros((1, g.kv_heads, tokens, g.head_dim), g.dtype)
    groups = g.head_dim // fmt.group_size
    return (mx.zeros((1, g.kv_heads, tokens, g.head_dim * fmt.bits // 32), mx.uint32),
            mx.zeros((1, g.kv_heads, tokens, groups), g.dtype), mx.zeros((1, g.kv_heads, tokens, groups), g.dtype))


def length(value: Stored) -> int:
    return _parts(value)[0].shape[2]


def first(value: Stored, count: int) -> Stored:
    """The first ``count`` tokens (views)."""
    return _like(value, [part[..., :count, :] for part in _parts(value)])


def joined(values: list[Stored]) -> Stored:
    """Pieces in token order, joined."""
    return _like(values[0], [mx.concatenate(list(parts), axis=2) for parts in zip(*map(_parts, values))])


def copied(value: Stored) -> Stored:
    """New arrays with the same contents (writes to one do not show in the other)."""
    return _like(value, [part[...] for part in _parts(value)])


def put(target: Stored, slot: int, source: Stored, start: int, count: int) -> None:
    """Write ``source``'s tokens ``start .. start + count`` into ``target``'s slots ``slot ..``."""
    for into, part in zip(_parts(target), _parts(source)):
        into[..., slot:slot + count, :] = part[..., start:start + count, :]


def nbytes(value: Stored) -> int:
    return sum(part.nbytes for part in _parts(value))


def tensor_names(fmt: KVFormat) -> tuple[str, ...]:
    """Names of a layer's tensors in a state dict: keys then values (quantized: packed words, scales, biases)."""
    if not fmt.quantized:
        return ("keys", "values")
    return ("keys", "keys.scales", "keys.biases", "values", "values.scales", "values.biases")


def flat(keys: Stored, values: Stored) -> tuple[mx.array, ...]:
    """A layer's keys and values as one tuple of arrays, keys first (``names`` order)."""
    return (*_parts(keys), *_parts(values))


def unflat(arrays: tuple[mx.array, ...]) -> tuple[Stored, Stored]:
    """The inverse of ``flat``."""
    half = len(arrays) // 2
    if half == 1:
        return arrays[0], arrays[1]
    return tuple(arrays[:half]), tuple(arrays[half:])


def check(keys: Stored, values: Stored, geometry: KVGeometry, where: str) -> None:
    """``CacheShapeError`` unless keys and values have the shapes and dtypes the geometry's format stores."""
    expected = zeros(geometry, length(keys))
    for name, value in (("keys", keys), ("values", values)):
        got, want = _parts(value), _parts(expected)
        if len(got) != len(want) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(got, want)):
            shapes = ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in got)
            raise CacheShapeError(f"{where}: {name} of {shapes} do not fit this cache ({geometry.format.name}, "
                                  f"{geometry.kv_heads} kv heads of {geometry.head_dim}, {geometry.dtype}).")
