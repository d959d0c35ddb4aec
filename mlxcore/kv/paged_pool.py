"""The paged block pool of one model: the bookkeeping plus the MLX storage of every layer.

Storage layout, per layer: keys and values of shape
(1, kv_heads, capacity_blocks * block_size, head_dim); block ``b`` owns token
slots ``b * block_size .. (b + 1) * block_size``. Storage starts empty and grows
in chunks of blocks as the bookkeeping hands out new ids, up to
``max_blocks``: memory is taken lazily, never the whole capacity up front.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcore.kv.block_manager import BlockManager, PoolStats, WriteSegment
from mlxcore.kv.geometry import KVGeometry, model_geometry

DEFAULT_CAPACITY_TOKENS = 65536

MAX_RUNS = 4  # a table of up to this many runs of adjacent blocks is gathered by slicing; more, by row gather


class Gather:
    """Where one sequence's tokens sit in storage, in order: runs of adjacent slots.

    One run is read as a view (no copy). Several are gathered into a new array:
    a few by slicing and concatenating, many with one ``mx.take`` over rows of
    the (kv_heads * capacity, head_dim) view of storage (a row gather is several
    times faster on CPU than a take along the token axis).
    """

    def __init__(self, block_ids: list[int], block_size: int) -> None:
        runs: list[list[int]] = []
        for block_id in block_ids:
            if runs and runs[-1][0] + runs[-1][1] == block_id * block_size:
                runs[-1][1] += block_size
            else:
                runs.append([block_id * block_size, block_size])
        self.runs = [tuple(run) for run in runs]  # (first slot, slots)
        self._rows: dict[tuple[int, int], mx.array] = {}  # (kv_heads, capacity) -> (kv_heads, slots) rows

    def rows(self, kv_heads: int, capacity: int) -> mx.array:
        """Row of every slot of the sequence in the flattened storage, (kv_heads, slots) int32."""
        key = (kv_heads, capacity)
        if key not in self._rows:
            slots = np.concatenate([np.arange(start, start + size) for start, size in self.runs])
            rows = np.arange(kv_heads)[:, None] * capacity + slots[None, :]
            self._rows[key] = mx.array(rows.astype(np.int32))
        return self._rows[key]


@dataclass(frozen=True)
class PoolConfig:
    """Geometry of a block pool."""

    block_size: int = 16  # token slots per block: the unit of sharing and of allocation
    max_blocks: int = DEFAULT_CAPACITY_TOKENS // 16  # capacity; appends beyond it raise PoolExhaustedError
    grow_blocks: int = 64  # storage grows by at least this many blocks (and by a quarter) at a time

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_blocks < 1 or self.grow_blocks < 1:
            raise ValueError("block_size, max_blocks and grow_blocks must each be at least 1.")


class LayerStorage:
    """The keys and values of every block, for one layer (layout in the module docstring)."""

    def __init__(self, geometry: KVGeometry, config: PoolConfig) -> None:
        self._geometry, self._config = geometry, config
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def capacity_blocks(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2] // self._config.block_size

    def ensure(self, blocks: int) -> None:
        """Grow (by a chunk) until block ids ``< blocks`` have slots."""
        have = self.capacity_blocks
        if blocks <= have:
            return
        grown = min(self._config.max_blocks, max(blocks, have + self._config.grow_blocks, have * 5 // 4))
        g = self._geometry
        extra = mx.zeros((1, g.kv_heads, (grown - have) * self._config.block_size, g.head_dim), g.dtype)
        if self.keys is None:
            self.keys, self.values = extra, mx.zeros_like(extra)
        else:
            self.keys = mx.concatenate([self.keys, extra], axis=2)
            self.values = mx.concatenate([self.values, mx.zeros_like(extra)], axis=2)

    def copy_block(self, source: int, target: int) -> None:
        size = self._config.block_size
        src, dst = slice(source * size, (source + 1) * size), slice(target * size, (target + 1) * size)
        self.keys[..., dst, :] = self.keys[..., src, :]
        self.values[..., dst, :] = self.values[..., src, :]

    def write(self, segments: tuple[WriteSegment, ...], keys: mx.array, values: mx.array) -> None:
        """Write new keys/values (1, kv_heads, L, head_dim) into the slots the segments name."""
        if len(segments) == 1:  # a decode step: no slicing of the input (each slice costs a call per layer)
            slot, length = segments[0].slot, segments[0].length
            self.keys[..., slot:slot + length, :] = keys
            self.values[..., slot:slot + length, :] = values
            return
        for seg in segments:
            self.keys[..., seg.slot:seg.slot + seg.length, :] = keys[..., seg.source:seg.source + seg.length, :]
            self.values[..., seg.slot:seg.slot + seg.length, :] = values[..., seg.source:seg.source + seg.length, :]

    def fetch(self, gather: Gather, length: int) -> tuple[mx.array, mx.array]:
        """The first ``length`` tokens of a sequence in order, each (1, kv_heads, length, head_dim).

        A view of storage when the sequence's first run of blocks holds them all, else a gathered copy.
        """
        if self.keys is None or not gather.runs:
            g = self._geometry
            empty = mx.zeros((1, g.kv_heads, 0, g.head_dim), g.dtype)
            return empty, empty
        start, size = gather.runs[0]
        if length <= size:
            return self.keys[..., start:start + length, :], self.values[..., start:start + length, :]
        return self.gather(gather, length)

    def gather(self, gather: Gather, length: int, spare: int = 0) -> tuple[mx.array, mx.array]:
        """A new contiguous copy of the first ``length`` tokens, followed by ``spare`` zero slots."""
        _, heads, capacity, dim = self.keys.shape
        if len(gather.runs) > MAX_RUNS:
            rows = gather.rows(heads, capacity)[:, :length]
            # take over rows gives (kv_heads, length, head_dim), contiguous
            keys = [mx.take(self.keys.reshape(heads * capacity, dim), rows, axis=0)[None]]
            values = [mx.take(self.values.reshape(heads * capacity, dim), rows, axis=0)[None]]
        else:
            pieces, left = [], length
            for start, size in gather.runs:
                if left <= 0:
                    break
                pieces.append(slice(start, start + min(size, left)))
                left -= size
            keys = [self.keys[..., piece, :] for piece in pieces]
            values = [self.values[..., piece, :] for piece in pieces]
        if spare:
            keys.append(mx.zeros((1, heads, spare, dim), self.keys.dtype))
            values.append(mx.zeros((1, heads, spare, dim), self.values.dtype))
        return mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2)

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class BlockPool:
    """Blocks of one model shared by all its paged caches: bookkeeping + per-layer storage."""

    def __init__(self, geometry: KVGeometry, config: PoolConfig = PoolConfig()) -> None:
        self.geometry, self.config = geometry, config
        self.manager = BlockManager(config.block_size, config.max_blocks)
        self.storage = [LayerStorage(geometry, config) for _ in range(geometry.num_layers)]

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def block_bytes(self) -> int:
        """Bytes of keys and values of one block across all layers."""
        return self.config.block_size * self.geometry.token_bytes

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write, in every layer that has storage (a layer never written holds nothing to copy)."""
        for layer in self.storage:
            if layer.keys is not None:
                layer.ensure(self.manager.materialized_blocks)
                for source, target in copies:
                    layer.copy_block(source, target)

    def stats(self) -> PoolStats:
        return self.manager.stats()

    @property
    def bytes_in_use(self) -> int:
        """Bytes of the blocks some sequence holds (shared blocks counted once)."""
        return self.manager.stats().used_blocks * self.block_bytes

    @property
    def bytes_allocated(self) -> int:
        """Bytes of MLX storage the pool has taken so far (grows in chunks, never shrinks)."""
        return sum(layer.nbytes for layer in self.storage)


def make_block_pool(model: nn.Module, *, block_size: int = 16, max_blocks: int | None = None,
                    max_kv: int | None = None, max_bytes: int | None = None,
                    grow_blocks: int = 64) -> BlockPool:
    """A pool for ``model``; capacity from ``max_blocks``, else ``max_kv`` tokens, else ``max_bytes``.

    With none given the pool may hold 65,536 tokens; memory is taken as blocks are used.
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
    return BlockPool(geometry, PoolConfig(block_size, max_blocks, grow_blocks))
