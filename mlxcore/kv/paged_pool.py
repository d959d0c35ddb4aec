"""The paged block pool of one model: the bookkeeping, the byte budget and the slabs of every layer.

Storage (``slab_storage.py``) is a list of slabs per layer. Slabs are added as
the bookkeeping hands out new ids (never a copy of what is there, so growing
never needs twice the memory) and the slabs at the end whose blocks are all free
are given back when a chat is released. With a ``KVBudget`` (bytes shared with
the other model's pool) the bookkeeping hands out only the blocks the budget can
hold, so running out is a ``PoolExhaustedError`` before anything changes.

Slab size: a chat whose blocks cross a slab boundary is read through a working
copy (``sequence_kv.py``), which costs its KV bytes again. 256 blocks (4,096
tokens) keeps a chat of up to 4,096 tokens a view; the price is memory taken
4,096 tokens at a time (``pool_peak_vs_held``, ``mlxcore/bench/pool_memory.py``:
1.37 at 3,000 tokens with these slabs, 2.05 with 1,024-token slabs).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn

from mlxcore.kv.block_manager import BlockManager, PoolStats
from mlxcore.kv.budget import KVBudget, format_bytes
from mlxcore.kv.errors import PoolExhaustedError
from mlxcore.kv.geometry import KVGeometry, model_geometry
from mlxcore.kv.slab_storage import LayerStorage

DEFAULT_CAPACITY_TOKENS = 65536

# Storage is taken and given back in slabs of this many blocks (4,096 tokens at 16 a block). A sequence's
# adjacent blocks within one slab are read as a view; one that crosses a slab reads a working copy, so
# slabs are made large enough that a chat rarely does (see the module docstring for the figures).
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
        self.manager = BlockManager(config.block_size, config.max_blocks)
        self.storage = [LayerStorage(geometry, config) for _ in range(geometry.num_layers)]
        self.slabs = 0  # slabs held in every layer
        self.working_bytes = 0  # bytes the sequences' working copies have taken (sequence_kv.py)
        if budget is not None:
            budget.pools.add(self)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def block_bytes(self) -> int:
        """Bytes of keys and values of one block across all layers."""
        return self.config.block_size * self.geometry.token_bytes

    def slab_bytes(self, index: int) -> int:
        return self.config.slab_size(index) * self.block_bytes

    @property
    def held_blocks(self) -> int:
        return min(self.slabs * self.config.slab_blocks, self.config.max_blocks)

    # the budget ------------------------------------------------------------

    def make_room(self, seq_id: int, count: int, working: int = 0) -> None:
        """Before an append of ``count`` tokens: let the manager hand out only the blocks the budget can hold
        after ``working`` more bytes of working copies, so that the append raises ``PoolExhaustedError``
        (changing nothing) rather than storage outgrowing the budget."""
        if self.budget is None:
            return
        self.manager.num_blocks = max(self._affordable_blocks(working), self.manager.materialized_blocks)
        if self.manager.available_blocks < self.manager.blocks_needed(seq_id, count) or working > self.budget.free:
            self.budget.reclaim()  # free slabs of every pool sharing the budget, cached prefixes too
            self.manager.num_blocks = max(self._affordable_blocks(working), self.manager.materialized_blocks)
        if working > self.budget.free:
            raise PoolExhaustedError(self.full_message(count))

    def _affordable_blocks(self, working: int) -> int:
        room, blocks, index = self.budget.free - working, self.held_blocks, self.slabs
        while blocks < self.config.max_blocks and room >= self.slab_bytes(index):
            room -= self.slab_bytes(index)
            blocks += self.config.slab_size(index)
            index += 1
        return blocks

    def full_message(self, count: int) -> str:
        """What is full, for a ``PoolExhaustedError`` when ``count`` more tokens do not fit."""
        if self.budget is not None and self.manager.num_blocks < self.config.max_blocks:
            return (f"The KV cache memory is full: {count} more tokens do not fit in its "
                    f"{format_bytes(self.budget.limit)} budget ({format_bytes(self.budget.in_use)} in use by "
                    f"the model's and the draft's chats).")
        tokens = self.config.max_blocks * self.block_size
        return (f"The KV cache is full: {count} more tokens do not fit in its {tokens:,} tokens "
                f"({format_bytes(self.kv_bytes)} in use).")

    def charge_working(self, size: int) -> None:
        """Working copies took (``size`` > 0) or gave back bytes; the budget was checked in ``make_room``."""
        if self.budget is not None:
            if size > 0:
                self.budget.force(size)
            else:
                self.budget.give(-size)
        self.working_bytes += size

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
        while self.slabs > keep:
            self.slabs -= 1
            freed += self.slab_bytes(self.slabs)
            for layer in self.storage:
                layer.drop_slab()
        if self.budget is not None and freed:
            self.budget.give(freed)
        return freed

    def drop_sequence(self, seq_id: int, charge: list[int]) -> None:
        """A cache was garbage collected without ``release()``: its blocks and working copies go back."""
        self.manager.drop_sequence(seq_id)
        self.charge_working(-charge[0])
        charge[0] = 0
        self.release_free_slabs()

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write, in every layer."""
        self.ensure()
        for layer in self.storage:
            for source, target in copies:
                layer.copy_block(source, target)

    # metrics -------------------------------------------------------------

    def stats(self) -> PoolStats:
        return self.manager.stats()

    @property
    def bytes_in_use(self) -> int:
        """Bytes of the blocks some sequence holds (shared blocks counted once)."""
        return self.manager.stats().used_blocks * self.block_bytes

    @property
    def bytes_allocated(self) -> int:
        """Bytes of MLX storage the pool holds now: its slabs (taken as blocks are used, given back when free)."""
        return sum(self.slab_bytes(index) for index in range(self.slabs))

    @property
    def kv_bytes(self) -> int:
        """All the KV memory of this pool: slabs plus the working copies of fragmented sequences."""
        return self.bytes_allocated + self.working_bytes


def make_block_pool(model: nn.Module, *, block_size: int = 16, max_blocks: int | None = None,
                    max_kv: int | None = None, max_bytes: int | None = None,
                    slab_blocks: int | None = None, budget: KVBudget | None = None) -> BlockPool:
    """A pool for ``model``; capacity from ``max_blocks``, else ``max_kv`` tokens, else ``max_bytes``.

    With none given the pool may hold 65,536 tokens; memory is taken a slab at a time
    as blocks are used, and within ``budget`` (shared with other pools) when one is given.
    Slabs hold ``slab_blocks`` blocks, by default 256 or an eighth of the budget if less.
    """
    geometry = model_geometry(model)
    if max_blocks is None and max_kv is not None:
        max_blocks = -(-max_kv // block_size)
    if max_blocks is None and max_bytes is not None:
        max_blocks = max_bytes // (block_size * geometry.token_bytes)
        if max_blocks < 1:
            raise ValueError(f"max_bytes={max_bytes} is smaller than one KV block.")
    if max_blocks is None:
        max_blocks = -(-DEFAULT_CAPACITY_TOKENS // block_size)
    if slab_blocks is None:
        slab_blocks = SLAB_BLOCKS
        if budget is not None:  # slabs small enough that a small budget still holds several
            slab_blocks = max(1, min(slab_blocks, budget.limit // (SLABS_PER_BUDGET * block_size * geometry.token_bytes)))
    return BlockPool(geometry, PoolConfig(block_size, max_blocks, slab_blocks), budget)
