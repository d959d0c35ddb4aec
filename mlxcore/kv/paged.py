"""The ``paged`` kind: one sequence's block table in a shared ``BlockPool``.

``PagedCache.begin(ids)`` appends the ids to the sequence's block table (new
blocks, copy-on-write of a shared partial tail, hashes of blocks that fill) and
keeps the resulting plan; each layer's ``update_and_fetch`` then writes its keys
and values where the plan says and returns the sequence in order for attention
without copying it (``sequence_kv.py``: a view of storage when the sequence's
blocks are adjacent, as for a lone chat; else a working copy that grows by the
same appends, for a fork, a shared prefix or a restored session).

Every forward pass needs ``begin(ids)`` first (mlx-lm's own generate loop does
not call it, so it cannot drive this kind); a pass without it raises
``CacheStateError``.
"""

from __future__ import annotations

import weakref
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import create_attention_mask

from mlxcore.kv.base import ModelCache, Tensors, layer_tensors, saved_layer
from mlxcore.kv.block_manager import AppendPlan
from mlxcore.kv.errors import CacheShapeError, CacheStateError, KVCacheError, PoolExhaustedError, TrimError
from mlxcore.kv.geometry import KVGeometry
from mlxcore.kv.paged_pool import BlockPool, make_block_pool
from mlxcore.kv.slab_storage import Gather
from mlxcore.kv.sequence_kv import SequenceKV, working_bytes

_NAMES = ("keys", "values")


class PagedLayerCache:
    """One layer's view of a paged sequence; follows ``LayerCache``. Made by ``PagedCache``."""

    def __init__(self, owner: PagedCache, index: int) -> None:
        self._owner, self.index = owner, index
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write (1, kv_heads, L, head_dim) keys/values announced by ``begin``; return the whole sequence."""
        return self._owner._update_layer(self, keys, values)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        return create_attention_mask(N, offset=self.offset, return_array=return_array, window_size=window_size)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Remove the last ``n`` tokens of this layer; the block table follows once all layers did."""
        if not 0 <= n <= self.offset:
            raise TrimError(f"Paged KV cache: cannot trim {n} of {self.offset} tokens.")
        self.offset -= n
        self._owner._sync_table()
        return n

    @property
    def state(self) -> tuple[mx.array, mx.array]:
        """This layer's keys and values in token order, (1, kv_heads, offset, head_dim) each."""
        return self._owner._fetch(self)

    @property
    def meta_state(self) -> tuple[str, ...]:
        return ("paged", str(self.offset))

    @property
    def nbytes(self) -> int:
        """Bytes of this sequence's blocks in this layer (shared blocks counted in every sequence)."""
        blocks = len(self._owner.pool.manager.block_ids(self._owner.seq_id))
        return blocks * self._owner.pool.block_bytes // len(self._owner.layers)


class PagedCache(ModelCache):
    """A sequence in a ``BlockPool``: prefix sharing, copy-on-write forks, block-exact trims."""

    kind = "paged"

    def __init__(self, pool: BlockPool, seq_id: int | None = None) -> None:
        """A new empty sequence in ``pool``, or (``seq_id``) one the pool's manager already holds."""
        self.pool = pool
        self.seq_id = pool.manager.new_sequence() if seq_id is None else seq_id
        self.layers: list[PagedLayerCache] = [PagedLayerCache(self, i) for i in range(pool.geometry.num_layers)]
        for layer in self.layers:
            layer.offset = len(pool.manager.token_ids(self.seq_id))
        self._plan: AppendPlan | None = None
        self._pending_layers = 0
        self._gather: tuple[int, Gather] | None = None  # (table version, gather) cache
        self._reads = SequenceKV(len(self.layers))  # what attention reads: views or working copies
        self._charged = [0]  # bytes of working copies counted in the pool (and its budget), in a list for the finalizer
        # Give the blocks back when the cache is garbage collected without release().
        weakref.finalize(self, pool.drop_sequence, self.seq_id, self._charged)

    @property
    def geometry(self) -> KVGeometry:
        return self.pool.geometry

    def reuse_prefix(self, ids: list[int]) -> int:
        self._settle()
        self._reads.clear()
        reused = self.pool.manager.reuse_prefix(self.seq_id, ids)
        for layer in self.layers:
            layer.offset = reused
        return reused

    def fork(self) -> PagedCache:
        self._settle()
        return PagedCache(self.pool, self.pool.manager.fork(self.seq_id))

    def release(self) -> None:
        self._plan = None
        self._reads.clear()
        self._charge_working(0)
        self.pool.manager.release(self.seq_id)
        for layer in self.layers:
            layer.offset = 0
        self.pool.release_free_slabs()

    def state_dict(self) -> tuple[Tensors, dict[str, Any]]:
        """Only this sequence's tokens, in order (not whole blocks, not other sequences')."""
        self._settle()
        arrays = [self._fetch(layer) for layer in self.layers] if self.offset else []
        meta = {"kind": self.kind, "tokens": self.tokens, "block_size": self.pool.block_size}
        return layer_tensors(_NAMES, arrays), meta

    @property
    def working_bytes(self) -> int:
        """Bytes of the contiguous working copies attention reads while this sequence's blocks are not adjacent."""
        return self._reads.nbytes

    @classmethod
    def _restore(cls, model: nn.Module, tensors: Tensors, meta: dict[str, Any], pool: Any) -> PagedCache:
        pool = pool or make_block_pool(model, block_size=int(meta.get("block_size", 16)))
        cache, ids = cls(pool), [int(t) for t in meta.get("tokens", [])]
        if not ids:
            return cache
        try:
            cache._write_saved(tensors, ids)
        except KVCacheError:
            cache.release()
            raise
        return cache

    def _write_saved(self, tensors: Tensors, ids: list[int]) -> None:
        saved = [saved_layer(tensors, layer.index, _NAMES) for layer in self.layers]
        if any(keys.shape[2:3] != (len(ids),) for keys, _ in saved):
            raise CacheStateError("Saved paged KV state: tensor length and token count differ.")
        reused = self.reuse_prefix(ids)  # blocks another session already holds are shared, not copied
        self.begin(ids[reused:])
        for layer, (keys, values) in zip(self.layers, saved):
            self._write_layer(layer, keys[..., reused:, :], values[..., reused:, :])  # no read: built when decoding
        mx.eval([s.arrays for s in self.pool.storage])

    # internals -------------------------------------------------------------

    def _token_ids(self) -> list[int]:
        return self.pool.manager.token_ids(self.seq_id)

    def _begin(self, ids: list[int]) -> None:
        working = self._working_after(len(ids))
        self.pool.make_room(self.seq_id, len(ids), max(working - self._charged[0], 0))
        try:
            plan = self.pool.manager.append(self.seq_id, ids)  # raises before any change if the pool is full
        except PoolExhaustedError:
            raise PoolExhaustedError(self.pool.full_message(len(ids))) from None
        self._charge_working(max(working, self._charged[0]))
        self.pool.copy_blocks(plan.copies)
        self.pool.ensure()
        self._plan, self._pending_layers = plan, len(self.layers)

    def _working_after(self, count: int) -> int:
        """The most bytes the working copies may hold after appending ``count`` tokens: none while the
        sequence stays one run of adjacent blocks in one slab (``sequence_kv.py``), else all its tokens."""
        manager, slab_blocks = self.pool.manager, self.pool.config.slab_blocks
        length = len(self._token_ids()) + count
        needed, blocks = manager.blocks_needed(self.seq_id, count), manager.block_ids(self.seq_id)
        fragmented = self._charged[0] > 0 or len(self._gather_index().runs) > 1
        if needed and not fragmented:
            grown = len(blocks) + needed  # blocks after the append
            tail_shared = -(-length // self.pool.block_size) < grown
            first = manager.next_block(self.seq_id)
            start = blocks[0] if blocks else first
            fragmented = tail_shared or first is None or (start + grown - 1) // slab_blocks != start // slab_blocks \
                or any(b < manager.materialized_blocks and manager.ref_count(b) for b in range(first, first + needed))
        return working_bytes(length, self.pool.geometry.token_bytes) if fragmented else 0

    def _charge_working(self, size: int) -> None:
        self.pool.charge_working(size - self._charged[0])
        self._charged[0] = size

    def _correct_tail(self, ids: list[int]) -> None:
        self.pool.manager.correct_tail(self.seq_id, ids)

    def _check_layers_agree(self) -> None:
        self._settle()

    def _settle(self) -> None:
        """Drop what a ``begin`` without (or with half) a forward pass left behind."""
        lowest = min(layer.offset for layer in self.layers)
        for layer in self.layers:
            layer.offset = lowest
        self._plan = None
        self._sync_table()

    def _sync_table(self) -> None:
        """Trim the block table to the longest layer (layers trim one by one)."""
        manager = self.pool.manager
        excess = len(manager.token_ids(self.seq_id)) - max(layer.offset for layer in self.layers)
        if excess > 0 and self._plan is None:
            manager.trim(self.seq_id, excess)

    def _update_layer(self, layer: PagedLayerCache, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self._write_layer(layer, keys, values)
        read = self._reads.read(layer.index, self.pool.storage[layer.index], self._gather_index(), layer.offset)
        if self._plan is None:
            self._settle_working()
        return read

    def _write_layer(self, layer: PagedLayerCache, keys: mx.array, values: mx.array) -> None:
        plan = self._plan
        if plan is None or layer.offset != plan.start:
            raise CacheStateError("Paged KV cache: call begin(ids) before each forward pass.")
        try:
            self.pool.geometry.check(keys, values, "paged KV cache")
            if keys.shape[2] != plan.length:
                raise CacheShapeError(f"paged KV cache: begin announced {plan.length} tokens, "
                                      f"the forward pass feeds {keys.shape[2]}.")
        except CacheShapeError:
            self._settle()  # undo the begin: the cache is left as it was
            raise
        self.pool.storage[layer.index].write(plan.segments, keys, values)
        self._reads.wrote(layer.index, plan.start, keys, values)
        layer.offset += plan.length
        self._pending_layers -= 1
        if not self._pending_layers:
            self._plan = None  # the forward pass is complete

    def _settle_working(self) -> None:
        """After a forward pass: count what the working copies hold, not what ``begin`` set aside."""
        self._charge_working(self._reads.nbytes)

    def _fetch(self, layer: PagedLayerCache) -> tuple[mx.array, mx.array]:
        """The layer's tokens read from the blocks themselves (session files, ``state``)."""
        return self.pool.storage[layer.index].fetch(self._gather_index(), layer.offset)

    def _gather_index(self) -> Gather:
        manager = self.pool.manager
        version = manager.version(self.seq_id)
        if self._gather is None or self._gather[0] != version:
            self._gather = (version, Gather(manager.block_ids(self.seq_id), self.pool.block_size,
                                            self.pool.config.slab_blocks))
        return self._gather[1]
