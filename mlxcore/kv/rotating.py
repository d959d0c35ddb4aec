"""The ``rotating`` kind: a window of ``max_size`` tokens that keeps the first ``keep`` and can rewind.

Who attends to whom, and which slot holds which token: ``window.py``. Unlike mlx-lm's ``RotatingKVCache``,
it holds ``max_rewind`` spare slots, so a speculative rewind of up to ``max_rewind`` tokens stays exact
after the window wrapped, and a trim it cannot do raises ``TrimError``.

Memory: keys/values of (1, kv_heads, slots, head_dim), grown in steps of 256
slots up to max_size + max_rewind, then flat however long the chat runs. With
8-bit keys and values (``kv_format.py``) each is a (packed, scales, biases)
tuple of such arrays, written quantized and read as stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import create_attention_mask

from mlxcore.kv import stored
from mlxcore.kv.base import CacheMeta, ModelCache, Tensors, layer_tensors, saved_layer
from mlxcore.kv.errors import CacheStateError, TrimError
from mlxcore.kv.geometry import KVGeometry, model_geometry
from mlxcore.kv.protocol import Mask
from mlxcore.kv.window import Window

if TYPE_CHECKING:
    from mlxcore.kv.paged_pool import BlockPool

_STEP = 256


class RotatingLayerCache:
    """One layer of the rotating cache; follows ``LayerCache``."""

    def __init__(self, geometry: KVGeometry, window: Window) -> None:
        self._geometry, self.window = geometry, window
        self.keys: stored.Stored | None = None  # (1, kv_heads, slots, head_dim), or its quantized parts
        self.values: stored.Stored | None = None
        self.offset = 0
        self.high = 0  # one past the largest position ever written
        if geometry.format.quantized:  # mlx-lm's attention reads what update_and_fetch returns as stored
            self.bits, self.group_size = geometry.format.bits, geometry.format.group_size

    @property
    def wrapped(self) -> bool:
        """Whether some ring slot was overwritten (then ``keep`` can no longer change)."""
        return self.high > self.window.slots

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[stored.Stored, stored.Stored]:
        """Store (1, kv_heads, N, head_dim) keys/values; return the keys/values that ``make_mask(N)`` describes."""
        self._geometry.check(keys, values, "rotating KV cache")
        layout, count = self._layout(keys.shape[2])
        new_keys, new_values = (stored.encode(x, self._geometry.format) for x in (keys, values))
        if layout != "concat":
            self._write(new_keys, new_values)
            held_keys, held_values = self._slots()
            return stored.first(held_keys, count), stored.first(held_values, count)
        # Too many new tokens for the ring: attend over the old slots + all new tokens, then store.
        fetched = (new_keys, new_values)
        if count:
            held_keys, held_values = self._slots()
            fetched = (stored.joined([stored.first(held_keys, count), new_keys]),
                       stored.joined([stored.first(held_values, count), new_values]))
        self._write(new_keys, new_values)
        return fetched

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Mask:
        """The mask for ``N`` new queries, matching what ``update_and_fetch`` will return."""
        layout, count = self._layout(N)
        w, end = self.window, self.offset + N
        if layout == "plain":
            if window_size is None:
                mask: Mask = create_attention_mask(N, offset=self.offset, return_array=return_array, window_size=None)
                return mask
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
    def state(self) -> tuple[stored.Stored, stored.Stored]:
        """The filled slots, (1, kv_heads, slots, head_dim) each (or their parts), in slot order (``window.py``)."""
        if self.keys is None:
            empty = stored.zeros(self._geometry, 0)
            return empty, empty
        count = min(self.high, self.window.slots)
        keys, values = self._slots()
        return stored.first(keys, count), stored.first(values, count)

    @property
    def meta_state(self) -> tuple[str, ...]:
        w = self.window
        return tuple(map(str, (self.offset, self.high, w.keep, w.max_size, w.max_rewind)))

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        keys, values = self._slots()
        return stored.nbytes(keys) + stored.nbytes(values)

    # internals -------------------------------------------------------------

    def _slots(self) -> tuple[stored.Stored, stored.Stored]:
        """The keys and values held; only once something was written (keys and values are set together)."""
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def _layout(self, n: int) -> tuple[str, int]:
        """How ``n`` new tokens are stored and fetched, and how many slots the fetch starts with.

        "plain": slots equal positions and every query sees every earlier token,
        so the fetch is the first offset + n slots, causal as in ``KVCache``.
        "ring": write first, then fetch every filled slot under an array mask.
        "concat": fetch the filled slots (before writing) followed by the new tokens."""
        w, end = self.window, self.offset + n
        high = max(self.high, end)
        if end <= w.max_size and high <= w.slots:
            return "plain", end
        if w.fits_in_place(self.offset, self.high, n):
            return "ring", min(high, w.slots)
        return "concat", min(self.high, w.slots)

    def _write(self, keys: stored.Stored, values: stored.Stored) -> None:
        w, start, n = self.window, self.offset, stored.length(keys)
        self._grow(min(start + n, w.slots))
        held_keys, held_values = self._slots()
        for position, length in _runs(w, start, n):
            slot, source = w.slot_of(position), position - start
            stored.put(held_keys, slot, keys, source, length)
            stored.put(held_values, slot, values, source, length)
        self.offset = start + n
        self.high = max(self.high, self.offset)

    def _grow(self, slots: int) -> None:
        have = 0 if self.keys is None else stored.length(self.keys)
        if slots <= have:
            return
        size = min(self.window.slots, max(slots, have + _STEP))
        if self.keys is None:
            self.keys, self.values = stored.zeros(self._geometry, size), stored.zeros(self._geometry, size)
        else:
            extra = stored.zeros(self._geometry, size - have)
            keys, values = self._slots()
            self.keys, self.values = stored.joined([keys, extra]), stored.joined([values, extra])


def _runs(w: Window, start: int, n: int) -> list[tuple[int, int]]:
    """(first position, length) runs of positions start..start+n that land in adjacent slots.
    Only the last ``ring`` positions past ``keep`` are stored: older ones would be overwritten anyway."""
    end, runs = start + n, []
    if start < w.keep:
        runs.append((start, min(w.keep, end) - start))
    position = max(w.keep, start, end - w.ring)
    while position < end:
        length = min(end - position, w.slots - w.slot_of(position))
        runs.append((position, length))
        position += length
    return runs


class RotatingCache(ModelCache):
    """A rotating window cache per layer; its owner's ids are the whole history fed, of which the window is seen.

    ``keep`` (the system prompt length) may be set until the window first fills
    and while no slot has been overwritten; changing it then alters no past
    attention, since until then every token saw every earlier one."""

    kind = "rotating"

    def __init__(self, geometry: KVGeometry, window: Window) -> None:
        self.layers: list[RotatingLayerCache] = [RotatingLayerCache(geometry, window)
                                                 for _ in range(geometry.num_layers)]
        self.geometry = geometry

    @property
    def window(self) -> Window:
        return self.layers[0].window

    @property
    def window_size(self) -> int:
        return self.window.max_size

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
        for mine, theirs in zip(self.layers, child.layers):
            theirs.offset, theirs.high = mine.offset, mine.high
            if mine.keys is not None:  # new arrays: writes stay apart
                keys, values = mine._slots()
                theirs.keys, theirs.values = stored.copied(keys), stored.copied(values)
        return child

    def state_dict(self, ids: Sequence[int]) -> tuple[Tensors, CacheMeta]:
        """Every filled slot and the ring's counters: a wrapped cache restores exactly."""
        self.settle()
        w, first = self.window, self.layers[0]
        fmt = self.geometry.format
        arrays = [stored.flat(*layer.state) for layer in self.layers] if first.keys is not None else []
        meta: CacheMeta = {"kind": self.kind, "tokens": self.held_ids(ids), "offset": first.offset, "high": first.high,
                "max_size": w.max_size, "keep": w.keep, "max_rewind": w.max_rewind,
                "kv_format": fmt.name, "kv_bits": fmt.bits, "group_size": fmt.group_size}
        return layer_tensors(stored.tensor_names(fmt), arrays), meta

    @classmethod
    def _restore(cls, model: nn.Module, tensors: Tensors, meta: CacheMeta, pool: BlockPool | None) -> RotatingCache:
        try:
            window = Window(int(meta["max_size"]), int(meta["keep"]), int(meta["max_rewind"]))
            offset, high, ids = int(meta["offset"]), int(meta["high"]), [int(t) for t in meta["tokens"]]
        except (KeyError, TypeError, ValueError) as error:
            raise CacheStateError(f"Saved rotating KV state has bad metadata: {error}") from None
        if len(ids) != offset or not offset <= high:
            raise CacheStateError("Saved rotating KV state: offsets and token count differ.")
        cache = cls(model_geometry(model, meta.get("kv_bits")), window)  # a window keeps the format it was saved in
        for index, layer in enumerate(cache.layers if high else []):
            keys, values = stored.unflat(saved_layer(tensors, index, stored.tensor_names(cache.geometry.format)))
            stored.check(keys, values, cache.geometry, "saved rotating KV state")
            if stored.length(keys) != min(high, window.slots):
                raise CacheStateError("Saved rotating KV state: slot count does not fit its window.")
            layer.keys, layer.values, layer.offset, layer.high = keys, values, offset, high
        return cache
