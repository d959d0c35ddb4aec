"""One decode step for several sequences of a hybrid model (Qwen3.5, Qwen3-Next): mlx-lm's model whole, on a batch.

Each sequence keeps its own ``HybridCache``; a step runs mlx-lm's layers once over a (B, 1) input on a batch
view of those caches (a left-padded ``BatchKVCache``, the rows' linear states stacked), as mlx-lm's
``BatchGenerator`` does, and each sequence then takes its row back. The view is kept while the batch does
not change. How, and why: docs/hybrid.md, "Batching".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.kv.hybrid import HybridCache
from mlxcore.kv.linear_state import LinearState


class HybridBatchDecoder:
    """Feeds one token to each of several ``HybridCache`` sequences in one pass of ``model``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._view: list[BatchKVCache | LinearState] = []  # per layer, in the model's order
        self._rows: list[HybridCache] = []
        self._given: list[mx.array] = []  # each row's first linear state as this decoder left it
        self._offsets: list[int] = []

    def __call__(self, caches: list[HybridCache], inputs: mx.array, feeds: Sequence[PromptFeed] = ()) -> mx.array:
        """Logits (B, V) of each sequence's next token after ``inputs`` (B,)."""
        if feeds:
            raise ValueError("Prompt chunks do not ride in a hybrid model's decode pass: prompts are read alone.")
        for cache in caches:
            cache.begin(1)
        if not self._current(caches):
            self.release()
            self._build(caches)
        logits: mx.array = self.model(inputs[:, None], cache=self._view)[:, -1, :]
        self._hand_back()
        return logits

    def _current(self, caches: list[HybridCache]) -> bool:
        """Whether the view still stands for ``caches``: the same sequences, in order, none fed since."""
        return len(caches) == len(self._rows) and all(
            cache is row and cache.states[0][1] is given and cache.offset == offset
            for cache, row, given, offset in zip(caches, self._rows, self._given, self._offsets))

    def _build(self, caches: list[HybridCache]) -> None:
        self._rows = list(caches)
        self._view = []
        for j, is_linear in enumerate(caches[0].is_linear):
            layers = [cache.layers[j] for cache in caches]
            if is_linear:
                self._view.append(_stacked([layer for layer in layers if isinstance(layer, LinearState)]))
            else:
                self._view.append(BatchKVCache.merge(layers))

    def _hand_back(self) -> None:
        """Each row's part of the pass into its own cache (see the module docstring)."""
        written: list[mx.array] = []
        for j, view in enumerate(self._view):
            for i, cache in enumerate(self._rows):
                own = cache.layers[j]
                if isinstance(view, LinearState):
                    assert isinstance(own, LinearState)
                    first, second = view[0], view[1]
                    assert first is not None and second is not None  # the pass wrote both
                    own[0], own[1] = first[i:i + 1], second[i:i + 1]
                    own.advance(1)
                else:
                    kv, keys, values = cast(KVCache, own), cast(mx.array, view.keys), cast(mx.array, view.values)
                    end = view._idx
                    kv.update_and_fetch(keys[i:i + 1, :, end - 1:end], values[i:i + 1, :, end - 1:end])
                    written += [cast(mx.array, kv.keys), cast(mx.array, kv.values)]
        # Written now with the pass: left lazy, each step's writes would chain and keep the view's old arrays.
        mx.async_eval(written)
        self._given = [cast(mx.array, cache.states[0][1]) for cache in self._rows]
        self._offsets = [cache.offset for cache in self._rows]

    def release(self) -> None:
        """Drop the view (the batch changed, or nothing decodes); rows whose states are still slices of it copy
        them out, so that their chats do not keep the whole batch's states."""
        copies: list[mx.array] = []
        for cache, given in zip(self._rows, self._given):
            if cache.states and cache.states[0][1] is given:
                for state in cache.states:
                    first, second = cast(mx.array, state[0]), cast(mx.array, state[1])  # (a fed row's)
                    first, second = mx.contiguous(first), mx.contiguous(second)
                    state[0], state[1] = first, second
                    copies += [first, second]
        mx.eval(copies)
        self._view, self._rows, self._given, self._offsets = [], [], [], []


def _stacked(states: list[LinearState]) -> LinearState:
    """The rows' states of one linear layer as one batch (a row never fed reads zeros, as mlx-lm's layer does)."""
    parts: list[mx.array | None] = []
    for part in (0, 1):
        arrays = [state[part] for state in states]
        known = next((a for a in arrays if a is not None), None)
        if known is None:
            parts.append(None)
            continue
        parts.append(mx.concatenate([a if a is not None else mx.zeros_like(known) for a in arrays]))
    return LinearState((parts[0], parts[1]))
