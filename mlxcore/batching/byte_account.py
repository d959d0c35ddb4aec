"""The scheduler's ``BlockAccount`` for caches outside a pool: a hybrid model's (Qwen3.5) standard caches.

Counted in units of one token's attention KV (target and draft) within the engine's KV budget; what a
running and a waiting sequence count, and the kept caches as obtainable: docs/hybrid.md, "Batching".
Caches of chats that are not running (a ChatSession between turns) are outside the count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mlxcore.batching.sequence import Sequence
from mlxcore.kv.hybrid import HybridCache

if TYPE_CHECKING:
    from mlxcore.engine import Engine


class ByteAccount:
    """Bytes of the running sequences' caches against the engine's KV budget, in tokens of KV."""

    def __init__(self, engine: Engine, running: Callable[[], list[Sequence]]) -> None:
        self.engine, self.running = engine, running
        self.unit = engine.kv_token_bytes

    def obtainable(self) -> int:
        room = max(self.engine.kv_budget.limit - sum(self._bytes(seq) for seq in self.running()), 0)
        if self.engine.prefixes is not None:
            self.engine.prefixes.shrink(room)
        return room // self.unit

    def needed(self, seq: Sequence, tokens: int) -> int:
        if seq.caches is None:
            return tokens + 2 * -(-self.engine.linear_state_bytes // self.unit)
        return tokens

    def held(self, seq: Sequence) -> int:
        return self._bytes(seq) // self.unit

    def _bytes(self, seq: Sequence) -> int:
        """A running sequence's bytes, read every step: its KV, and a set of linear states for its own and each
        snapshot's (counted whole even where a new snapshot still shares the cache's arrays: a bound, and a few
        operations a sequence rather than one a state array)."""
        if seq.caches is None:
            return 0
        target, draft = seq.caches.target, seq.caches.draft
        held = target.nbytes
        if isinstance(target, HybridCache):
            held = target.attention.nbytes + self.engine.linear_state_bytes * (1 + len(target.snapshots))
        return held + (draft.nbytes if draft is not None else 0)
