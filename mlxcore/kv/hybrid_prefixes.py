"""Prefix caching for a hybrid model (Qwen3.5, Qwen3-Next): ended sequences' caches, kept for the next prompt.

A hybrid model's linear states cannot be cut into blocks, so its released caches are kept whole (by
reference: nothing is copied but the states a batch still shared); ``find`` gives a new sequence the kept
cache that covers the most of its prompt, all of it or its deepest snapshot within their common prefix.
At most ``limit`` bytes, least recently used out (docs/hybrid.md, "Prefix caching between requests").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcore.kv.errors import CacheStateError
from mlxcore.sequences import common_prefix_length

if TYPE_CHECKING:
    from mlxcore.kv.hybrid import HybridCache


class HybridPrefixCache:
    """Ended hybrid caches by the tokens they hold, least recently used first, within ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: list[tuple[tuple[int, ...], HybridCache, int]] = []  # (tokens, cache, bytes)

    @property
    def bytes(self) -> int:
        return sum(size for _, _, size in self.entries)

    def keep(self, cache: HybridCache, ids: Sequence[int]) -> None:
        """Keep what ``cache`` holds (it is released after) under ``ids``, those of its tokens; a cache a pass
        left half way is not kept."""
        try:
            cache.settle()
        except CacheStateError:
            return
        tokens = tuple(ids[:cache.offset])
        if not tokens or len(tokens) != cache.offset or any(state.offset != len(tokens) for state in cache.states):
            return
        entry = cache.fork()
        entry.prefixes = None
        for state in entry.states:  # rows of a batch's arrays (hybrid_batch.py) would keep the whole batch
            first, second = state[0], state[1]
            assert first is not None and second is not None, "a state that read tokens holds its arrays"
            state[0], state[1] = mx.contiguous(first), mx.contiguous(second)
        mx.eval([part for state in entry.states for part in (state[0], state[1])])  # (lazy, they would too)
        size = entry.held_bytes
        if size > self.limit:
            return
        self.entries = [e for e in self.entries if e[0] != tokens] + [(tokens, entry, size)]
        self.shrink(self.limit)

    def find(self, ids: list[int]) -> HybridCache | None:
        """A cache holding the longest start of ``ids`` a kept cache can give (at least one token of ``ids``
        left to compute), or None."""
        best, best_tokens = None, 0
        for entry in self.entries:
            tokens, cache, _ = entry
            keep = min(common_prefix_length(tokens, ids), len(ids) - 1)
            usable = len(tokens) if keep >= len(tokens) else max(
                (offset for offset, _ in cache.snapshots if 0 < offset <= keep), default=0)
            if usable > best_tokens:
                best, best_tokens = entry, usable
        if best is None:
            return None
        self.entries.remove(best)
        self.entries.append(best)  # the most recently used
        found = best[1].fork()
        if found.offset > best_tokens:
            found.restore_snapshot(best_tokens)
        return found

    def shrink(self, room: int) -> None:
        """Let go of the least recently used caches until they hold at most ``room`` bytes (live caches want
        the rest: ``batching/pool_account.py``)."""
        while self.entries and self.bytes > room:
            self.entries.pop(0)

    def clear(self) -> None:
        self.entries = []

