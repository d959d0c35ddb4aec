"""The paged block pool of one model: the bookkeeping, the byte budget and the slabs of every layer.

Storage (``slab_storage.py``) is a list of slabs per layer. Slabs are added as
the bookkeeping hands out new ids (never a copy of what is there, so growing
never needs twice the memory) and the slabs at the end whose blocks are all free
are given back when a chat is released. With a ``KVBudget`` (bytes shared with
the other model's pool) the bookkeeping hands out only the blocks the budget can
hold, so running out is a ``PoolExhaustedError`` before anything changes.

Slabs are large, 256 blocks (4,096 tokens): attention reads one view per run of adjacent blocks
(``decode_attention.py``), and smaller slabs cut a long chat into more runs; the price is memory taken a
slab at a time (docs/decisions.md, "Slab size").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.nn as nn

from mlxcore.kv.block_manager import BlockManager, PoolStats
from mlxcore.kv.budget import KVBudget, format_bytes
from mlxcore.kv.geometry import KVGeometry, model_geometry
from mlxcore.kv.slab_storage import LayerStorage

if TYPE_CHECKING:
    from mlxcore.kv.pool_disk import PoolDisk

DEFAULT_CAPACITY_TOKENS = 65536

# Storage is taken and given back in slabs of this many blocks (4,096 tokens at 16 a block): few runs for
# attention to read in a long chat, at the price of memory taken 4,096 tokens at a time (module docstring).
SLAB_BLOCKS = 256
SLABS_PER_BUDGET = 8  # a budget holds at least this many slabs (smaller slabs for a small budget)


@dataclass(frozen=True)
class PoolConfig:
    """Geometry of a block pool."""

    block_size: int = 16  # token slots per block: the unit of sharing and of allocation
    max_blocks: int = DEFAULT_CAPACITY_TOKENS // 16  # capacity; appends beyond it raise PoolExhaustedError
    slab_blocks: int = SLAB_BLOCKS  # storage is taken and given back in slabs of this many blocks

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_blocks < 1 or self.slab_blocks < 1:
            raise ValueError("block_size, max_blocks and slab_blocks must each be at least 1.")

    def slab_size(self, index: int) -> int:
        """Blocks in slab ``index`` (the last one stops at ``max_blocks``)."""
        return min(self.slab_blocks, self.max_blocks - index * self.slab_blocks)


class BlockPool:
    """Blocks of one model shared by all its paged caches: bookkeeping + per-layer storage in slabs."""

    def __init__(self, geometry: KVGeometry, config: PoolConfig = PoolConfig(),
                 budget: KVBudget | None = None) -> None:
        self.geometry, self.config, self.budget = geometry, config, budget
        # Read on every step: bytes of keys and values of one block across all layers; token slots of a slab
        self.block_size, self.block_bytes = config.block_size, config.block_size * geometry.token_bytes
        self.slab_slots = config.slab_blocks * config.block_size
        self.manager = BlockManager(config.block_size, config.max_blocks)
        self.storage = [LayerStorage(geometry, config) for _ in range(geometry.num_layers)]
        self.slabs = 0  # slabs held in every layer
        self.disk: PoolDisk | None = None  # the disk tier under it (``attach_disk``), or None
        if budget is not None:
            budget.pools.add(self)

    def slab_bytes(self, index: int) -> int:
        return self.config.slab_size(index) * self.block_bytes

    @property
    def held_blocks(self) -> int:
        return min(self.slabs * self.config.slab_blocks, self.config.max_blocks)

    # the disk tier ---------------------------------------------------------

    def attach_disk(self, disk: PoolDisk) -> None:
        """Full blocks leaving memory go to ``disk`` from now on; prefix lookups that miss read from it."""
        self.disk = disk
        self.manager.leaving = []

    def save_leaving(self) -> None:
        """Hand the blocks the manager just evicted (their storage not yet reused) to the disk tier."""
        leaving = self.manager.leaving
        if self.disk is not None and leaving:
            self.manager.leaving = []
            self.disk.save(leaving)

    def save_held(self) -> None:
        """Hand the full blocks sequences still hold to the disk tier (a chat's, before the process ends)."""
        if self.disk is not None:
            self.disk.save(self.manager.held_hashed())

    # the budget ------------------------------------------------------------

    def make_room(self, needed: int) -> None:
        """Before an append that takes ``needed`` blocks (``BlockManager.append`` calls it): let the manager hand
        out only the blocks the budget can hold, so that the append raises ``PoolExhaustedError`` (changing
        nothing) rather than storage outgrowing it."""
        if self.budget is None:
            return
        self.manager.num_blocks = max(self._affordable_blocks(), self.manager.materialized_blocks)
        if self.manager.available_blocks < needed:
            self.budget.reclaim()  # free slabs of every pool sharing the budget, cached prefixes too
            self.manager.num_blocks = max(self._affordable_blocks(), self.manager.materialized_blocks)

    def obtainable_blocks(self) -> int:
        """Blocks appends could take now: free ones (cached prefixes included) and those of slabs the budget
        can still add. Tensor-free; the batching scheduler admits requests by it."""
        if self.budget is None:
            return self.manager.available_blocks
        affordable = self._affordable_blocks()
        if affordable < self.config.max_blocks:  # the budget binds: the other pools' free slabs count too
            affordable = self._affordable_blocks(self.budget.free + self.budget.reclaimable(besides=self))
        materialized = self.manager.materialized_blocks
        return self.manager.free_blocks + max(affordable, materialized) - materialized

    def reclaimable_bytes(self) -> int:
        """Bytes ``release_free_slabs(cached=True)`` would give back."""
        keep = -(-self.manager.free_tail_start(True) // self.config.slab_blocks)
        return sum(self.slab_bytes(index) for index in range(keep, self.slabs))

    def _affordable_blocks(self, room: int | None = None) -> int:
        """Blocks held and those of the slabs ``room`` bytes (the budget's free ones) can add in order: full
        slabs, then a last shorter one (read on every scheduler step, so counted, not looped)."""
        config, blocks = self.config, self.held_blocks
        if room is None:
            assert self.budget is not None, "a pool without a budget never asks what it affords"
            room = self.budget.free
        full = config.slab_blocks * self.block_bytes
        whole = min(room // full, (config.max_blocks - blocks) // config.slab_blocks)
        blocks, room = blocks + whole * config.slab_blocks, room - whole * full
        rest = config.max_blocks - blocks
        return blocks + rest if 0 < rest < config.slab_blocks and room >= rest * self.block_bytes else blocks

    def full_message(self, count: int) -> str:
        """What is full, for a ``PoolExhaustedError`` when ``count`` more tokens do not fit."""
        if self.budget is not None and self.manager.num_blocks < self.config.max_blocks:
            return (f"The KV cache memory is full: {count} more tokens do not fit in its "
                    f"{format_bytes(self.budget.limit)} budget ({format_bytes(self.budget.in_use)} in use by "
                    f"the model's and the draft's chats).")
        tokens = self.config.max_blocks * self.block_size
        return (f"The KV cache is full: {count} more tokens do not fit in its {tokens:,} tokens "
                f"({format_bytes(self.kv_bytes)} in use).")

    # storage ---------------------------------------------------------------

    def ensure(self) -> None:
        """Add slabs until every block the manager handed out has storage."""
        while self.held_blocks < self.manager.materialized_blocks:
            if self.budget is not None:
                self.budget.force(self.slab_bytes(self.slabs))
            for layer in self.storage:
                layer.add_slab()
            self.slabs += 1

    def release_free_slabs(self, cached: bool = False) -> int:
        """Give back the slabs at the end whose blocks are all free (and unhashed, unless ``cached``); bytes freed."""
        keep = -(-self.manager.free_tail_start(cached) // self.config.slab_blocks)
        freed = 0
        if keep < self.slabs:
            self.manager.shrink(min(self.manager.materialized_blocks, keep * self.config.slab_blocks))
            self.save_leaving()  # before their slabs go
        while self.slabs > keep:
            self.slabs -= 1
            freed += self.slab_bytes(self.slabs)
            for layer in self.storage:
                layer.drop_slab()
        if self.budget is not None and freed:
            self.budget.give(freed)
        return freed

    def drop_sequence(self, seq_id: int) -> None:
        """A cache was garbage collected without ``release()``: its blocks go back."""
        self.manager.drop_sequence(seq_id)
        self.release_free_slabs()

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write, in every layer."""
        if not copies:  # (most appends copy nothing)
            return
        self.ensure()
        for layer in self.storage:
            for source, target in copies:
                layer.copy_block(source, target)

    # metrics -------------------------------------------------------------

    def stats(self) -> PoolStats:
        return self.manager.stats()

    @property
    def bytes_allocated(self) -> int:
        """Bytes of MLX storage the pool holds now: its slabs (taken as blocks are used, given back when free)."""
        return sum(self.slab_bytes(index) for index in range(self.slabs))

    @property
    def kv_bytes(self) -> int:
        """All the KV memory of this pool (its slabs; attention reads them in place)."""
        return self.bytes_allocated


def make_block_pool(model: nn.Module, *, block_size: int = 16, max_blocks: int | None = None,
                    max_kv: int | None = None, slab_blocks: int | None = None, budget: KVBudget | None = None,
                    kv_bits: int | None = None) -> BlockPool:
    """A pool for ``model``; capacity from ``max_blocks``, else ``max_kv`` tokens.

    With none given the pool may hold 65,536 tokens; memory is taken a slab at a time
    as blocks are used, and within ``budget`` (shared with other pools) when one is given.
    Slabs hold ``slab_blocks`` blocks, by default 256 or an eighth of the budget if less.
    ``kv_bits``: keys and values quantized to this many bits (``kv_format.py``); None: float.
    """
    geometry = model_geometry(model, kv_bits)
    if max_blocks is None and max_kv is not None:
        max_blocks = -(-max_kv // block_size)
    if max_blocks is None:
        max_blocks = -(-DEFAULT_CAPACITY_TOKENS // block_size)
    if slab_blocks is None:
        slab_blocks = SLAB_BLOCKS
        if budget is not None:  # slabs small enough that a small budget still holds several
            slab_blocks = max(1, min(slab_blocks, budget.limit // (SLABS_PER_BUDGET * block_size * geometry.token_bytes)))
    return BlockPool(geometry, PoolConfig(block_size, max_blocks, slab_blocks), budget)
