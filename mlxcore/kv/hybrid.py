"""Caches of a hybrid model (Qwen3.5): its attention layers' keys and values, and its linear layers' states.

``HybridCache`` holds one cache of a usual kind over the attention layers (``attention``) and a
``LinearState`` per linear layer (``linear_state.py``), handing the model its ``layers`` in the model's
order; its ``state_dict`` is the attention cache's with the linear states beside. The linear states cannot
be trimmed, so neither can the whole (``max_trim`` is 0): a caller that will want to go back sets a
``mark`` (``rewind_to_mark``), and the cache keeps ``snapshots`` a next turn may go back to
(``restore_snapshot``); both keep states by reference, copying nothing (docs/hybrid.md, "Caches",
"Snapshots", "Speculative decoding, exact"). With ``prefixes`` it gives what it held to that store when
released, and an empty one takes its start from there (``hybrid_prefixes.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.nn as nn

from mlxcore.kv.base import CacheMeta, ModelCache, Tensors
from mlxcore.kv.errors import CacheStateError
from mlxcore.kv.linear_state import LinearState
from mlxcore.kv.protocol import LayerCache

if TYPE_CHECKING:
    from mlxcore.kv.hybrid_prefixes import HybridPrefixCache
    from mlxcore.kv.paged_pool import BlockPool

MAX_SNAPSHOTS = 4  # each holds every linear layer's state (tens of MiB on a 9B model), kept by reference


def linear_layers(model: nn.Module) -> list[bool]:
    """For each of ``model``'s layers, whether it is a linear-attention layer (empty for a model without any)."""
    flags = [hasattr(layer, "linear_attn") for layer in model.layers]
    return flags if any(flags) else []


class HybridCache(ModelCache):
    """The attention layers' cache of any float kind, and a state per linear layer; see the module docstring."""

    kind = "hybrid"

    def __init__(self, attention: ModelCache, is_linear: Sequence[bool],
                 states: Sequence[LinearState] | None = None, prefixes: HybridPrefixCache | None = None) -> None:
        self.attention, self.is_linear = attention, list(is_linear)
        self.geometry = attention.geometry
        self.states = list(states) if states is not None else [LinearState() for flag in is_linear if flag]
        self.prefixes = prefixes  # where a released cache's contents go, and an empty one's start comes from
        self._mark: tuple[int, list[LinearState]] | None = None  # (offset, states) to go back to
        self.snapshots: list[tuple[int, list[LinearState]]] = []  # (offset, states), oldest first
        self._last_fed = 0  # tokens the last pass fed
        self._asked: int | None = None  # where the caller last asked for a snapshot (``snapshot``)
        self._interleave()

    def _interleave(self) -> None:
        """The model takes both kinds of layer cache, each where its layer is."""
        kv, linear = iter(self.attention.layers), iter(self.states)
        self.layers: list[LayerCache | LinearState] = [  # type: ignore[assignment]
            next(linear) if flag else next(kv) for flag in self.is_linear]

    @property
    def offset(self) -> int:
        return self.attention.offset

    @property
    def max_trim(self) -> int:
        return 0

    @property
    def keep(self) -> int:
        return self.attention.keep

    @keep.setter
    def keep(self, keep: int) -> None:
        self.attention.keep = keep

    @property
    def window_size(self) -> int | None:
        return self.attention.window_size

    def mark(self) -> None:
        """Remember this point, so that ``rewind_to_mark`` can come back to it."""
        self._mark = (self.offset, [state.copy() for state in self.states])

    def rewind_to_mark(self) -> int:
        """Go back to the last ``mark`` (the attention layers trimmed, the linear states as they were); return the
        tokens dropped, those the caller feeds again if it keeps them."""
        if self._mark is None:
            raise CacheStateError("rewind_to_mark needs a mark set before the tokens to drop were fed.")
        dropped = self.offset - self._mark[0]
        self._go_back(*self._mark)
        return dropped

    def settle(self) -> None:
        """Even out a pass stopped between layers (Ctrl+C): the attention layers go back to the shortest; linear
        states that went ahead cannot, so the cache goes back to its mark or its deepest snapshot below, else
        to nothing. It then holds a start of what it held, every layer alike."""
        self.attention.settle()
        if all(state.offset == self.offset for state in self.states):
            return
        points = [point for point in [self._mark, *self.snapshots] if point is not None and point[0] <= self.offset]
        if points:
            self._go_back(*max(points, key=lambda point: point[0]))
            return
        self.attention.trim(self.offset)
        for state in self.states:
            state.clear()
        self.snapshots = []

    def restore_snapshot(self, keep: int) -> int | None:
        """Go back to the deepest snapshot holding at most ``keep`` tokens; its length, or None if there is none
        (or the attention layers cannot be trimmed that far: a wrapped rotating window)."""
        usable = [snap for snap in self.snapshots
                  if 0 < snap[0] <= keep and self.offset - snap[0] <= self.attention.max_trim]
        if not usable:
            return None
        self._go_back(*usable[-1])
        return self.offset

    def _go_back(self, offset: int, states: list[LinearState]) -> None:
        """Hold the first ``offset`` tokens again, with the linear ``states`` saved there; later snapshots go."""
        self.attention.trim(self.offset - offset)
        for state, saved in zip(self.states, states):
            state.restore(saved)
        self.snapshots = [snap for snap in self.snapshots if snap[0] <= offset]

    def fork(self) -> HybridCache:
        child = HybridCache(self.attention.fork(), self.is_linear, [state.copy() for state in self.states],
                            self.prefixes)
        child.snapshots = list(self.snapshots)  # their states are never written: shared
        return child

    def reuse_prefix(self, ids: Sequence[int]) -> int:
        """On an empty cache, start from the kept cache holding the longest start of ``ids`` (``prefixes``);
        return the tokens it holds then (never all of ``ids``)."""
        if self.offset:
            raise CacheStateError("reuse_prefix needs an empty cache.")
        found = self.prefixes.find(list(ids)) if self.prefixes is not None else None
        if found is None:
            return 0
        self.attention, self.snapshots = found.attention, found.snapshots
        for state, kept in zip(self.states, found.states):
            state.restore(kept)
        self._interleave()
        return self.offset

    def release(self, ids: Sequence[int] = ()) -> None:
        if self.prefixes is not None and self.offset and ids:
            self.prefixes.keep(self, ids)
        self.attention.release()
        for state in self.states:
            state.clear()
        self.snapshots, self._mark = [], None

    @property
    def nbytes(self) -> int:
        return self.attention.nbytes + sum(state.nbytes for state in self.states)

    @property
    def held_bytes(self) -> int:
        """What letting go of this cache frees: its KV, and every linear-state array it keeps (its own and its
        snapshots', which share some)."""
        arrays = {id(a): a for states in [self.states, *(states for _, states in self.snapshots)]
                  for state in states for a in (state[0], state[1]) if a is not None}
        return self.attention.nbytes + sum(a.nbytes for a in arrays.values())

    def state_dict(self, ids: Sequence[int]) -> tuple[Tensors, CacheMeta]:
        """The attention cache's state, and (``linear.<set>.<layer>.<part>``) the linear states of its snapshots
        and its own, last: a reopened chat goes back where the live one would (a history that drops the last
        reply's thinking, to the snapshot at the last prompt's end)."""
        tensors, meta = self.attention.state_dict(ids)
        kept = [snap for snap in self.snapshots if snap[0] < self.offset]
        kept += [(self.offset, self.states)] if self.offset else []
        shapes: dict[str, tuple[str, list[int]]] = {}
        for n, (_, states) in enumerate(kept):
            for j, state in enumerate(states):
                for part in (0, 1):
                    array = state[part]
                    if array is None:
                        raise CacheStateError("A linear layer's state is missing: the cache was never fed.")
                    tensors[f"linear.{n}.{j}.{part}"] = array
                    shapes[f"{j}.{part}"] = (str(array.dtype).rsplit(".", 1)[-1], list(array.shape))
        return tensors, {**meta, "linear": {"offsets": [offset for offset, _ in kept], "shapes": shapes}}

    @classmethod
    def _restore(cls, model: nn.Module, tensors: Tensors, meta: CacheMeta, pool: BlockPool | None) -> HybridCache:
        offsets = meta["linear"]["offsets"]
        own = meta.copy()
        del own["linear"]
        attention = ModelCache.from_state(
            model, {name: a for name, a in tensors.items() if not name.startswith("linear.")}, own, pool)
        is_linear = linear_layers(model)
        if offsets != sorted(set(offsets)) or (offsets[-1] if offsets else 0) != attention.offset:
            raise CacheStateError(f"Saved hybrid state: linear states at {offsets} for {attention.offset} tokens.")
        try:
            sets = [(offset, [LinearState((tensors[f"linear.{n}.{j}.0"], tensors[f"linear.{n}.{j}.1"]), offset)
                              for j in range(sum(is_linear))]) for n, offset in enumerate(offsets)]
        except KeyError as missing:
            raise CacheStateError(f"Saved hybrid state: the linear state {missing} is missing.") from None
        cache = cls(attention, is_linear, sets[-1][1] if sets else None)
        cache.snapshots = sets[:-1]
        return cache

    def snapshot(self, asked: bool = True) -> None:
        """Keep a snapshot here (the latest ``MAX_SNAPSHOTS``): a caller that knows a point worth going back to
        asks; ``_begin`` takes one after a pass of several tokens, unless that pass started where one was asked
        (a few tokens back: the slot is worth more for an older turn)."""
        if asked:
            self._asked = self.offset
        if self.offset and (not self.snapshots or self.snapshots[-1][0] < self.offset):
            self.snapshots = [*self.snapshots[-(MAX_SNAPSHOTS - 1):], (self.offset, [s.copy() for s in self.states])]

    def _begin(self, count: int) -> None:
        if self._last_fed > 1 and self._asked != self.offset - self._last_fed:
            self.snapshot(asked=False)
        self._last_fed = count
        self.attention._begin(count)
