"""The scheduler's ``BlockAccount``: block counts of the engine's target pool, read from the block manager (a
reply's own from its cache's pool); or, for a reply on caches of another kind (rotating, standard), no bound
(``NoPool``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxcore.batching.sequence import Sequence
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.paged_pool import BlockPool

if TYPE_CHECKING:
    from mlxcore.engine import Engine


class PoolAccount:
    """Counts blocks of the target's pool (the draft's shares the byte budget, which ``obtainable`` reads)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def pool(self) -> BlockPool:
        return self.engine.pool("target")

    def obtainable(self) -> int:
        return self.pool.obtainable_blocks()

    def needed(self, seq: Sequence, tokens: int) -> int:
        if seq.caches is not None:  # its own pool's count (a caller's cache may be in a pool of its own, or in none)
            cache = seq.caches.target
            return cache.pool.manager.blocks_needed(cache.seq_id, tokens) if isinstance(cache, PagedCache) else 0
        manager = self.pool.manager
        ids = seq.ids[:tokens]
        hit_tokens, free_hits = manager.cached_prefix(ids)
        blocks = -(-tokens // manager.block_size)
        return blocks - hit_tokens // manager.block_size + free_hits

    def held(self, seq: Sequence) -> int:
        cache = seq.caches.target if seq.caches is not None else None
        if not isinstance(cache, PagedCache):
            return 0
        manager = cache.pool.manager
        return sum(1 for block in manager.block_ids(cache.seq_id) if manager.ref_count(block) == 1)


class NoPool:
    """Caches that are not in a pool: a reply's grow as it needs (its context bounds it), nothing to count."""

    def obtainable(self) -> int:
        return 1 << 62

    def needed(self, seq: Sequence, tokens: int) -> int:
        return 0

    def held(self, seq: Sequence) -> int:
        return 0
