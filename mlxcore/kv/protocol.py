"""The per-layer KV cache protocol that mlx-lm's models call.

mlx-lm's Qwen3 attention calls ``update_and_fetch`` with the new keys and values
and attends over what it returns; ``offset`` gives the RoPE position; the model
asks the first layer's cache for ``make_mask``. Anything that follows this
protocol can stand in for mlx-lm's ``KVCache``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import mlx.core as mx

# What mlx-lm's models pass as an attention mask: None, "causal", or an array (boolean or additive).
Mask = mx.array | str | None
# Keys or values as attention reads them: (1, kv_heads, length, dim), or quantized per token (packed, scales,
# biases); a segment is one run of a sequence's keys and values.
Part = mx.array | tuple[mx.array, ...]
Segment = tuple[Part, Part]
FloatSegment = tuple[mx.array, mx.array]  # a segment of float keys and values
Stored = Part  # keys or values as a cache stores and returns them (``kv/stored.py``)


@runtime_checkable
class LayerCache(Protocol):
    @property
    def offset(self) -> int:
        """Tokens seen so far: the RoPE position of the next token."""
        ...

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Stored, Stored]:
        """Append keys/values of shape (B, n_kv_heads, L, head_dim); return all keys/values to attend over
        (a quantized cache's as their parts)."""
        ...

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Mask:
        """The attention mask for ``N`` new queries ("causal", an array, or None)."""
        ...

    def is_trimmable(self) -> bool: ...

    def trim(self, n: int) -> int:
        """Remove the last ``n`` tokens; return how many were removed."""
        ...

    @property
    def state(self) -> object: ...

    @property
    def meta_state(self) -> object: ...

    @property
    def nbytes(self) -> int: ...
