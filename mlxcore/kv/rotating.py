"""The ``rotating`` kind: a window of ``max_size`` tokens that keeps the first ``keep`` and can rewind.

Each query attends to the first ``keep`` tokens and the ``max_size - keep``
latest ones, itself included (exact rule and slot layout in ``window.py``).
Unlike mlx-lm's ``RotatingKVCache``, it holds ``max_rewind`` spare slots, so a
speculative rewind of up to ``max_rewind`` tokens stays exact after the window
wrapped, and a trim it cannot do raises ``TrimError``.

Memory: keys/values of (1, kv_heads, slots, head_dim), grown in steps of 256
slots up to max_size + max_rewind, then flat however long the chat runs.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import create_attention_mask

from mlxcore.kv.base import RecordedTokens, Tensors, layer_tensors, saved_layer
from mlxcore.kv.errors import CacheStateError, TrimError
from mlxcore.kv.geometry import KVGeometry, model_geometry
from mlxcore.kv.window import Window

_NAMES = ("keys", "values")
_STEP = 256


class RotatingLayerCache:
    """One layer of the rotating cache; follows ``LayerCache``."""

    def __init__(self, geometry: KVGeometry, window: Window) -> None:
        self._geometry, self.window = geometry, window
        self.keys: mx.array | None = None  # (1, kv_heads, slots, head_dim)
        self.values: mx.array | None = None
        self.offset = 0
        self.high = 0  # one past the largest position ever written

    @property
    def wrapped(self) -> bool:
        """Whether some ring slot was overwritten (then ``keep`` can no longer change)."""
        return self.high > self.window.slots

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Store (1, kv_heads, N, head_dim) keys/values; return the keys/values that ``make_mask(N)`` describes."""
        self._geometry.check(keys, values, "rotating KV cache")
        layout, count = self._layout(keys.shape[2])
        if layout != "concat":
            self._write(keys, values)
            return self.keys[..., :count, :], self.values[..., :count, :]
        # Too many new tokens for the ring: attend over the old slots + all new tokens, then store.
        fetched = (keys, values) if not count else (
            mx.concatenate([self.keys[..., :count, :], keys], axis=2),
            mx.concatenate([self.values[..., :count, :], values], axis=2))
        self._write(keys, values)
        return fetched

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        """The mask for ``N`` new queries, matching what ``update_and_fetch`` will return."""
        layout, count = self._layout(N)
        w, end = self.window, self.offset + N
        if layout == "plain":
            if window_size is None:
                return create_attention_mask(N, offset=self.offset, return_array=return_array, window_size=None)
            positions, valid = np.arange(end), np.ones(end, dtype=bool)
        elif layout == "ring":
            positions, valid = w.slot_positions(end, max(self.high, end), count)
        else:
            old, old_valid = w.slot_positions(self.offset, self.high, count)
            positions = np.concatenate([old, np.arange(self.offset, end)])
            valid = np.concatenate([old_valid, np.ones(N, dtype=bool)])
        return mx.array(w.mask(self.offset, N, positions, valid, window_size))

    def is_trimmable(self) -> bool:
        return self.max_trim > 0

    @property
    def max_trim(self) -> int:
        return self.window.max_trim(self.offset, self.high)

    def trim(self, n: int) -> int:
        """Remove exactly ``n`` tokens, or raise ``TrimError`` and change nothing."""
        if not 0 <= n <= self.max_trim:
            raise TrimError(f"Rotating KV cache: cannot rewind {n} tokens, at most {self.max_trim} "
                            f"(max_rewind={self.window.max_rewind} after the window wrapped).")
        self.offset -= n
        return n

    @property
    def state(self) -> tuple[mx.array, mx.array]:
        """The filled slots, (1, kv_heads, slots, head_dim) each, in slot order (see ``window.py``)."""
        if self.keys is None:
            g = self._geometry
            return (mx.zeros((1, g.kv_heads, 0, g.head_dim), g.dtype),) * 2
        count = min(self.high, self.window.slots)
        return self.keys[..., :count, :], self.values[..., :count, :]

    @property
    def meta_state(self) -> tuple[str, ...]:
        w = self.window
        return tuple(map(str, (self.offset, self.high, w.keep, w.max_size, w.max_rewind)))

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    # internals -------------------------------------------------------------

    def _layout(self, n: int) -> tuple[str, int]:
        """How ``n`` new tokens are stored and fetched, and how many slots the fetch starts with.

        "plain": slots equal positions and every query sees every earlier token,
        so the fetch is the first offset + n slots, causal as in ``KVCache``.
        "ring": write first, then fetch every filled slot under an array mask.
        "concat": fetch the filled slots (before writing) followed by the new tokens.
        """
        w, end = self.window, self.offset + n
        high = max(self.high, end)
        if end <= w.max_size and high <= w.slots:
            return "plain", end
        if w.fits_in_place(self.offset, self.high, n):
            return "ring", min(high, w.slots)
        return "concat", min(self.high, w.slots)

    def _write(self, keys: mx.array, values: mx.array) -> None:
        w, start, n = self.window, self.offset, keys.shape[2]
        self._grow(min(start + n, w.slots))
        for position, length in _runs(w, start, n):
            slot, source = w.slot_of(position), position - start
            self.keys[..., slot:slot + length, :] = keys[..., source:source + length, :]
            self.values[..., slot:slot + length, :] = values[..., source:source + length, :]
        self.offset = start + n
        self.high = max(self.high, self.offset)

    def _grow(self, slots: int) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        if slots <= have:
            return
        g = self._geometry
        size = min(self.window.slots, max(slots, have + _STEP))
        extra = mx.zeros((1, g.kv_heads, size - have, g.head_dim), g.dtype)
        if self.keys is None:
            self.keys, self.values = extra, mx.zeros_like(extra)
        else:
            self.keys = mx.concatenate([self.keys, extra], axis=2)
            self.values = mx.concatenate([self.values, mx.zeros_like(extra)], axis=2)


def _runs(w: Window, start: int, n: int) -> list[tuple[int, int]]:
    """(first position, length) runs of positions start..start+n that land in adjacent slots.

    Only the last ``ring`` positions past ``keep`` are stored: older ones would be overwritten anyway.
    """
    end, runs = start + n, []
    if start < w.keep:
        runs.append((start, min(w.keep, end) - start))
    position = max(w.keep, start, end - w.ring)
    while position < end:
        length = min(end - position, w.slots - w.slot_of(position))
        runs.append((position, length))
        position += length
    return runs


class RotatingCache(RecordedTokens):
    """A rotating window cache per layer; ``tokens`` is the whole history fed, of which the window is seen.

    ``keep`` (the system prompt length) may be set until the window first fills
    and while no slot has been overwritten; changing it then alters no past
    attention, since until then every token saw every earlier one.
    """

    kind = "rotating"

    def __init__(self, geometry: KVGeometry, window: Window) -> None:
        self.layers: list[RotatingLayerCache] = [RotatingLayerCache(geometry, window)
                                                 for _ in range(geometry.num_layers)]
        self.geometry, self._ids = geometry, []

    @property
    def window(self) -> Window:
        return self.layers[0].window

    @property
    def keep(self) -> int:
        return self.window.keep

    @keep.setter
    def keep(self, keep: int) -> None:
        first = self.layers[0]
        if keep != self.keep and (first.wrapped or first.offset > self.window.max_size):
            raise CacheStateError("The rotating KV cache's keep can only change before its window fills.")
        window = Window(self.window.max_size, keep, self.window.max_rewind)
        for layer in self.layers:
            layer.window = window

    @property
    def max_trim(self) -> int:
        return min(layer.max_trim for layer in self.layers)

    def fork(self) -> RotatingCache:
        child = RotatingCache(self.geometry, self.window)
        child._ids = self.tokens
        for mine, theirs in zip(self.layers, child.layers):
            theirs.offset, theirs.high = mine.offset, mine.high
            if mine.keys is not None:
                theirs.keys, theirs.values = mine.keys[...], mine.values[...]  # new arrays: writes stay apart
        return child

    def state_dict(self) -> tuple[Tensors, dict[str, Any]]:
        """Every filled slot and the ring's counters: a wrapped cache restores exactly."""
        self._check_layers_agree()
        w, first = self.window, self.layers[0]
        arrays = [layer.state for layer in self.layers] if first.keys is not None else []
        meta = {"kind": self.kind, "tokens": self.tokens, "offset": first.offset, "high": first.high,
                "max_size": w.max_size, "keep": w.keep, "max_rewind": w.max_rewind}
        return layer_tensors(_NAMES, arrays), meta

    @classmethod
    def _restore(cls, model: nn.Module, tensors: Tensors, meta: dict[str, Any], pool: Any) -> RotatingCache:
        try:
            window = Window(int(meta["max_size"]), int(meta["keep"]), int(meta["max_rewind"]))
            offset, high, ids = int(meta["offset"]), int(meta["high"]), [int(t) for t in meta["tokens"]]
        except (KeyError, TypeError, ValueError) as error:
            raise CacheStateError(f"Saved rotating KV state has bad metadata: {error}") from None
        if len(ids) != offset or not offset <= high:
            raise CacheStateError("Saved rotating KV state: offsets and token count differ.")
        cache = cls(model_geometry(model), window)
        cache._ids = ids
        for index, layer in enumerate(cache.layers if high else []):
            keys, values = saved_layer(tensors, index, _NAMES)
            cache.geometry.check(keys, values, "saved rotating KV state")
            if keys.shape[2] != min(high, window.slots):
                raise CacheStateError("Saved rotating KV state: slot count does not fit its window.")
            layer.keys, layer.values, layer.offset, layer.high = keys, values, offset, high
        return cache
