"""The MLX storage of one layer of a block pool, in slabs, and how a sequence's tokens are found in it.

Layout: a list of slabs, each keys and values of shape (2, kv_heads, slab_blocks * block_size,
width) (index 0 the keys, 1 the values: one write and one gather serve both), in one part (float)
or three (quantized: packed words, scales, biases; ``kv_format.py``); block ``b`` owns token slots
``(b % slab_blocks) * block_size ..`` of slab ``b // slab_blocks``. The bookkeeping (which blocks,
how many slabs) is ``paged_pool.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
import numpy.typing as npt

from mlxcore.device_profile import current
from mlxcore.kv.block_manager import WriteSegment
from mlxcore.kv.geometry import KVGeometry

SlotGroup = tuple[int, mx.array, mx.array | None]  # a slab, its slots (1, 1, n, 1), the rows writing them (None: all)
Place = tuple[int, int, int]  # a slab, its first slot, slots
Reads = list[Place] | tuple["Gather", int]  # views of these places, or (a sequence's runs, length) for one copy

if TYPE_CHECKING:
    from mlxcore.kv.paged_pool import PoolConfig



class Gather:
    """Where one sequence's tokens sit in storage, in order: runs of adjacent slots within one slab.

    Attention reads each run as a view (``segments``; ``decode_attention.py``).
    Where one array is needed, several runs are gathered into a new one: runs in
    one slab with one ``mx.take`` over rows of the (2 * kv_heads * slab slots,
    head_dim) view of that slab (a row gather is several times faster on CPU
    than a take along the token axis), runs over several slabs by joining them.
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

    def places(self, length: int, start: int = 0) -> list[Place]:
        """The runs that hold tokens ``start`` to ``length``, (slab, first slot, slots), cut to them."""
        runs, at = [], 0  # ``at``: the position of the run's first token
        for slab, first, size in self.runs:
            if at >= length:
                break
            skip, end = max(start - at, 0), min(size, length - at)
            if skip < end:
                runs.append((slab, first + skip, end - skip))
            at += size
        return runs

    def span(self, length: int) -> tuple[tuple[int, int, int], npt.NDArray[np.int32]] | None:
        """For the first ``length`` tokens in several runs of one slab with small gaps between them: the run
        (slab, first slot, slots) that spans them, and each of its slots' position in the sequence (-1 in a
        gap). None when they are one run, cross slabs, or the gaps are too wide to read."""
        runs = self.places(length)
        if len(runs) < 2 or len({slab for slab, _, _ in runs}) > 1:
            return None
        first, stop = min(start for _, start, _ in runs), max(start + size for _, start, size in runs)
        # Several runs in one slab are one view over the slots between them (the gaps masked out) while the
        # gaps are small (a fork's gap is one or two blocks).
        if stop - first - length > current().span_slack_slots * (len(runs) - 1):
            return None
        positions, at = np.full(stop - first, -1, np.int32), 0
        for _, start, size in runs:
            positions[start - first:start - first + size] = np.arange(at, at + size)
            at += size
        return (runs[0][0], first, stop - first), positions

    def rows(self, kv_heads: int, capacity: int) -> mx.array:
        """Row of every slot of the sequence in its (only) slab, flattened; (2, kv_heads, slots) int32."""
        key = (kv_heads, capacity)
        if key not in self._rows:
            slots = np.concatenate([np.arange(start, start + size) for _, start, size in self.runs])
            rows = np.arange(2 * kv_heads).reshape(2, kv_heads, 1) * capacity + slots
            self._rows[key] = mx.array(rows.astype(np.int32))
        return self._rows[key]


class LayerStorage:
    """The keys and values of every block, for one layer (layout in the module docstring).

    A slab is a tuple of parts, each (2, kv_heads, slab slots, width): for float keys and values one
    part (width head_dim); quantized, three (``mx.quantize``'s packed words, scales and biases per
    token). Keys and values come out as arrays (float) or as (packed, scales, biases) tuples, the form
    mlx-lm's quantized attention and ``decode_attention`` take.
    """

    def __init__(self, geometry: KVGeometry, config: PoolConfig) -> None:
        self._geometry, self._config = geometry, config
        self._float = not geometry.format.quantized  # one part a slab
        self.slabs: list[tuple[mx.array, ...]] = []

    def add_slab(self) -> None:
        slots = self._config.slab_size(len(self.slabs)) * self._config.block_size
        self.slabs.append(tuple(mx.zeros((2, *shape[:1], slots, *shape[1:]), dtype) for shape, dtype in self.parts()))

    def parts(self) -> list[tuple[tuple[int, int], mx.Dtype]]:
        """((kv_heads, width), dtype) of each part."""
        g, fmt = self._geometry, self._geometry.format
        if fmt.bits is None:
            return [((g.kv_heads, g.head_dim), g.dtype)]
        groups = g.head_dim // fmt.group_size
        return [((g.kv_heads, g.head_dim * fmt.bits // 32), mx.uint32),
                ((g.kv_heads, groups), g.dtype), ((g.kv_heads, groups), g.dtype)]

    def drop_slab(self) -> None:
        self.slabs.pop()

    def where(self, slot: int) -> tuple[int, int]:
        """(slab, slot in the slab) of a pool-wide slot."""
        return divmod(slot, self._config.slab_blocks * self._config.block_size)

    def copy_block(self, source: int, target: int) -> None:
        size = self._config.block_size
        (s_slab, s_at), (t_slab, t_at) = self.where(source * size), self.where(target * size)
        for from_part, to_part in zip(self.slabs[s_slab], self.slabs[t_slab]):
            to_part[:, :, t_at:t_at + size, :] = from_part[:, :, s_at:s_at + size, :]

    def encode(self, both: mx.array) -> tuple[mx.array, ...]:
        """Keys and values (2, kv_heads, n, head_dim) as this storage holds them (its parts)."""
        if self._float:
            return (both,)
        fmt = self._geometry.format
        return tuple(mx.quantize(both, group_size=fmt.group_size, bits=fmt.bits))

    def write(self, segments: tuple[WriteSegment, ...], keys: mx.array, values: mx.array) -> None:
        """Write new keys/values (1, kv_heads, L, head_dim) into the slots the segments name (never across a slab)."""
        self.write_parts(segments, self.encode(mx.concatenate([keys, values], axis=0)))

    def write_parts(self, segments: tuple[WriteSegment, ...], parts: tuple[mx.array, ...]) -> None:
        """As ``write``, for keys and values already encoded as this storage holds them (each (2, kv_heads, L,
        width)): a restored session's, or ``write``'s."""
        for seg in segments:
            slab, at = self.where(seg.slot)
            for target, part in zip(self.slabs[slab], parts):
                whole = seg.source == 0 and part.shape[2] == seg.length  # (a decode step's: no slice to make)
                target[:, :, at:at + seg.length, :] = part if whole else part[:, :, seg.source:seg.source + seg.length, :]

    def scatter(self, groups: list[SlotGroup], both: mx.array) -> tuple[tuple[mx.array, ...], list[mx.array]]:
        """Write keys and values (2, kv_heads, R, dim), one token a row, into the slots ``groups`` name
        (``SlotGroup``: per slab, its slots (1, 1, n, 1) and the rows that go there, None for every row);
        ``put_along_axis`` with the slots broadcast: one operation, where slice assignment at a list of slots
        is several. Returns ``both`` as this storage holds them (``encode``) and the slabs' new arrays. Float
        storage in one slab runs without helper calls (a pass writes every layer so)."""
        if self._float and len(groups) == 1 and groups[0][2] is None:
            slab, slots, _ = groups[0]
            self.slabs[slab] = (mx.put_along_axis(self.slabs[slab][0], mx.broadcast_to(slots, both.shape), both, axis=2),)
            return (both,), [self.slabs[slab][0]]
        parts, written = self.encode(both), list[mx.array]()
        for slab, slots, rows in groups:
            chosen = parts if rows is None else tuple(mx.take(part, rows, axis=2) for part in parts)
            self.slabs[slab] = tuple(mx.put_along_axis(target, mx.broadcast_to(slots, part.shape), part, axis=2)
                                     for target, part in zip(self.slabs[slab], chosen))
            written.extend(self.slabs[slab])
        return parts, written

    def fetch(self, gather: Gather, length: int, start: int = 0) -> tuple:
        """Tokens ``start`` to ``length`` of a sequence in order, keys and values (1, kv_heads, tokens, width).

        A view of storage when one run of blocks holds them all, else a gathered copy (for callers that need
        one array: session files, the batch's mirror, and attention that cannot read segments).
        """
        places = gather.places(length, start) if self.slabs else []
        if len(places) == 1:
            return self.view(*places[0])
        return self.gather(gather, length, start) if places else self._empty()

    def read(self, reads: Reads) -> list[tuple]:
        """Keys and values of a sequence as attention reads them (``PagedCache.read_plan``): each place's
        (1, kv_heads, slots, width), in order, as views; or one copy, for (runs, length). Float storage
        without helper calls (a pass reads every layer so)."""
        if not isinstance(reads, list):
            return [self.fetch(*reads)]
        if not self.slabs or not reads:
            return [self._empty()]
        views = []
        for slab, start, size in reads:
            if not self._float:
                views.append(self.view(slab, start, size))
                continue
            part = self.slabs[slab][0]
            if start or size < part.shape[2]:  # a whole slab needs no slice (one operation less)
                part = part[:, :, start:start + size, :]
            views.append((part[0:1], part[1:2]))
        return views

    def view(self, slab: int, start: int, size: int) -> tuple:
        """Keys and values of ``size`` adjacent slots of one slab, as a view: (1, kv_heads, size, width) each."""
        parts: Sequence[mx.array] = self.slabs[slab]
        if start or size < parts[0].shape[2]:
            parts = [part[:, :, start:start + size, :] for part in parts]
        return self._split(parts)

    def gather(self, gather: Gather, length: int, start: int = 0) -> tuple:
        """A new contiguous copy of tokens ``start`` to ``length`` (keys, values)."""
        slabs = {slab for slab, _, _ in gather.runs}
        if len(slabs) == 1:  # one take, however many runs (joining their slices costs an operation each)
            slab = slabs.pop()
            parts = []
            for part in self.slabs[slab]:
                two, heads, capacity, width = part.shape
                rows = gather.rows(heads, capacity)[..., start:length]
                # take over rows gives (2, kv_heads, length, width), contiguous
                parts.append(mx.take(part.reshape(two * heads * capacity, width), rows, axis=0))
            return self._split(parts)
        keys, values = zip(*self.read(gather.places(length, start)))
        return _joined(keys), _joined(values)

    def _split(self, parts: Sequence[mx.array]) -> tuple:
        """Keys and values of parts (2, kv_heads, n, width) each."""
        return self._pair([part[0:1] for part in parts], [part[1:2] for part in parts])

    def _pair(self, keys: list[mx.array], values: list[mx.array]) -> tuple:
        if self._geometry.format.quantized:
            return tuple(keys), tuple(values)
        return keys[0], values[0]

    def _empty(self) -> tuple:
        return self._split([mx.zeros((2, shape[0], 0, shape[1]), dtype) for shape, dtype in self.parts()])

    @property
    def arrays(self) -> list[mx.array]:
        return [part for parts in self.slabs for part in parts]

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.arrays)


def _joined(pieces: tuple) -> object:
    """Pieces of keys (or values) in order, joined along the token axis: arrays, or quantized tuples."""
    if isinstance(pieces[0], tuple):
        return tuple(mx.concatenate(list(part), axis=2) for part in zip(*pieces))
    return pieces[0] if len(pieces) == 1 else mx.concatenate(list(pieces), axis=2)
