"""The MLX storage of one layer of a block pool, in slabs, and how a sequence's tokens are found in it.

Layout: a list of slabs, each one array of keys and values, shape (2, kv_heads, slab_blocks *
block_size, head_dim) (index 0 the keys, 1 the values: one write and one gather serve both); block
``b`` owns token slots ``(b % slab_blocks) * block_size ..`` of slab ``b // slab_blocks``. The
bookkeeping (which blocks, how many slabs) is ``paged_pool.py``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from mlxcore.kv.block_manager import WriteSegment
from mlxcore.kv.geometry import KVGeometry

if TYPE_CHECKING:
    from mlxcore.kv.paged_pool import PoolConfig

MAX_RUNS = 4  # a table of up to this many runs of adjacent blocks is gathered by slicing; more, by row gather


class Gather:
    """Where one sequence's tokens sit in storage, in order: runs of adjacent slots within one slab.

    Attention reads each run as a view (``segments``; ``decode_attention.py``).
    Where one array is needed, several runs are gathered into a new one: a few
    by slicing and concatenating, many (all in one slab) with one ``mx.take``
    over rows of the (2 * kv_heads * slab slots, head_dim) view of that slab (a
    row gather is several times faster on CPU than a take along the token axis).
    """

    def __init__(self, block_ids: list[int], block_size: int, slab_blocks: int) -> None:
        runs: list[list[int]] = []
        for block_id in block_ids:
            slab, first = divmod(block_id, slab_blocks)
            if runs and runs[-1][0] == slab and runs[-1][1] + runs[-1][2] == first * block_size:
                runs[-1][2] += block_size
            else:
                runs.append([slab, first * block_size, block_size])
        self.runs = [tuple(run) for run in runs]  # (slab, first slot in the slab, slots)
        self._rows: dict[tuple[int, int], mx.array] = {}  # (kv_heads, slab slots) -> (kv_heads, slots) rows

    def rows(self, kv_heads: int, capacity: int) -> mx.array:
        """Row of every slot of the sequence in its (only) slab, flattened; (2, kv_heads, slots) int32."""
        key = (kv_heads, capacity)
        if key not in self._rows:
            slots = np.concatenate([np.arange(start, start + size) for _, start, size in self.runs])
            rows = np.arange(2 * kv_heads).reshape(2, kv_heads, 1) * capacity + slots
            self._rows[key] = mx.array(rows.astype(np.int32))
        return self._rows[key]


class LayerStorage:
    """The keys and values of every block, for one layer (layout in the module docstring)."""

    def __init__(self, geometry: KVGeometry, config: PoolConfig) -> None:
        self._geometry, self._config = geometry, config
        self.slabs: list[mx.array] = []  # one (2, kv_heads, slab slots, head_dim) array per slab

    def add_slab(self) -> None:
        g, slots = self._geometry, self._config.slab_size(len(self.slabs)) * self._config.block_size
        self.slabs.append(mx.zeros((2, g.kv_heads, slots, g.head_dim), g.dtype))

    def drop_slab(self) -> None:
        self.slabs.pop()

    def where(self, slot: int) -> tuple[int, int]:
        """(slab, slot in the slab) of a pool-wide slot."""
        return divmod(slot, self._config.slab_blocks * self._config.block_size)

    def copy_block(self, source: int, target: int) -> None:
        size = self._config.block_size
        (s_slab, s_at), (t_slab, t_at) = self.where(source * size), self.where(target * size)
        self.slabs[t_slab][:, :, t_at:t_at + size, :] = self.slabs[s_slab][:, :, s_at:s_at + size, :]

    def write(self, segments: tuple[WriteSegment, ...], keys: mx.array, values: mx.array) -> None:
        """Write new keys/values (1, kv_heads, L, head_dim) into the slots the segments name (never across a slab)."""
        both = mx.concatenate([keys, values], axis=0)  # (2, kv_heads, L, head_dim)
        if len(segments) == 1:  # a decode step: no slicing of the input (each slice costs a call per layer)
            slab, at = self.where(segments[0].slot)
            self.slabs[slab][:, :, at:at + segments[0].length, :] = both
            return
        for seg in segments:
            slab, at = self.where(seg.slot)
            self.slabs[slab][:, :, at:at + seg.length, :] = both[:, :, seg.source:seg.source + seg.length, :]

    def scatter(self, slab: int, slots: mx.array, both: mx.array) -> None:
        """Write one token each into ``slots`` (n,) of ``slab``: ``both`` (2, kv_heads, n, head_dim)."""
        self.slabs[slab][:, :, slots, :] = both

    def fetch(self, gather: Gather, length: int) -> tuple[mx.array, mx.array]:
        """The first ``length`` tokens of a sequence in order, each (1, kv_heads, length, head_dim).

        A view of storage when the sequence's first run of blocks holds them all, else a gathered copy
        (for callers that need one array: session files, and attention that cannot read segments).
        """
        if not self.slabs or not gather.runs:
            return self._empty()
        slab, start, size = gather.runs[0]
        if length <= size:
            return _split(self.slabs[slab][:, :, start:start + length, :])
        return self.gather(gather, length)

    def segments(self, gather: Gather, length: int) -> list[tuple[mx.array, mx.array]]:
        """The first ``length`` tokens as views of storage, one (keys, values) pair per run, in order."""
        if not self.slabs or not gather.runs:
            return [self._empty()]
        views, left = [], length
        for slab, start, size in gather.runs:
            if left <= 0:
                break
            both = self.slabs[slab]
            if start or min(size, left) < both.shape[2]:  # a whole slab needs no slice (one op less per layer)
                both = both[:, :, start:start + min(size, left), :]
            views.append(_split(both))
            left -= size
        return views

    def gather(self, gather: Gather, length: int) -> tuple[mx.array, mx.array]:
        """A new contiguous copy of the first ``length`` tokens."""
        _, heads, _, dim = self.slabs[0].shape
        slabs = {slab for slab, _, _ in gather.runs}
        if len(gather.runs) > MAX_RUNS and len(slabs) == 1:
            slab = slabs.pop()
            capacity = self.slabs[slab].shape[2]
            rows = gather.rows(heads, capacity)[..., :length]
            # take over rows gives (2, kv_heads, length, head_dim), contiguous
            return _split(mx.take(self.slabs[slab].reshape(2 * heads * capacity, dim), rows, axis=0))
        views = self.segments(gather, length)
        return mx.concatenate([k for k, _ in views], axis=2), mx.concatenate([v for _, v in views], axis=2)

    def _empty(self) -> tuple[mx.array, mx.array]:
        g = self._geometry
        empty = mx.zeros((1, g.kv_heads, 0, g.head_dim), g.dtype)
        return empty, empty

    @property
    def arrays(self) -> list[mx.array]:
        return self.slabs

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.slabs)


def _split(both: mx.array) -> tuple[mx.array, mx.array]:
    """Keys and values, (1, kv_heads, n, head_dim) each, of a (2, kv_heads, n, head_dim) array."""
    return both[0:1], both[1:2]
