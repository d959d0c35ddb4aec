"""The running batch's keys and values kept in one array per layer between decode steps.

Attention of a batch reads every sequence's tokens as one padded array
(``batch_forward.py``). Taking that array out of the block pool in every layer
of every step would copy all the batch reads, once per slab the batch spans
(docs/decisions.md, "Batching: the mirror"; "The running batch on a GPU").

The mirror keeps the copy instead: row r holds one sequence's tokens in order,
(2, rows, kv_heads, capacity, width) flattened to (-1, width) per layer and stored part
so that one ``put_along_axis`` writes each step's new keys and values (beside the pool's
own write: the pool stays the record). A row is filled from the pool only when
its sequence joins the batch or was changed outside it (a prompt chunk, a
speculative round's rows), and then only from where it changed (``PagedCache.intact``:
a round refills its k + 1 tokens, not the reply, and a rewind alone none). That copy
is part of the step's pass, as the writes are: the mirror never makes the
engine wait for a computation. Rows double their length as they grow (copied
over, not read again from the pool). A sequence much longer than the others is
not mirrored: it attends alone over views of its blocks, so that neither every
row is padded to it nor the mirror grows to hold it (``_alone``).

Rows hold keys and values as the pool stores them: float, or quantized (packed words, scales and biases,
attended as they are, as mlx-lm's quantized cache is). Its bytes come from the KV budget (without one, at
most the pool's own size); when the batch would need more, or the budget has no room, each sequence attends
over views of its blocks. The budget can take the bytes back (``release_free_slabs``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import numpy as np

from mlxcore.decode_attention import Attended, Attention, attend_parts, batch_attention
from mlxcore.kv.protocol import Segment
from mlxcore.device_profile import current
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.paged_pool import BlockPool

CAPACITY_STEP = 256  # row lengths are multiples of this (and double as rows grow)


Ints = np.ndarray[tuple[int], np.dtype[np.int64]]  # (n,) mirror rows, or positions in them
Where = tuple[mx.array, ...]  # per stored part, the flat rows (put_along_axis's index) tokens go to


@dataclass
class _Row:
    cache: weakref.ref  # the PagedCache this row copies
    length: int  # tokens the row holds


@dataclass
class MirrorStep:
    """Where one step's sequences read and write (made by ``BatchMirror.plan``)."""

    mirrored: list[tuple[int, int]]  # (batch row, mirror row) of the sequences read from the mirror
    alone: list[tuple[int, PagedCache]]  # (batch row, cache) of much longer ones, read from the pool alone
    fills: list[tuple[PagedCache, int, Where]]  # stale rows' caches, where their stale tokens start in the
    # sequence and where they go in the row: copied from the pool first
    select: mx.array | None  # (M,) the mirrored batch rows, to pick their keys and values; None: every row
    writes: Where  # where each new key and value number goes
    valid: mx.array  # (R, 1, 1, longest) True where a mirror row holds a token, the new ones included
    attention: Attention  # the rows' attention over their keys, under ``valid`` (``batch_attention``)
    longest: int  # keys the mirror's rows attend to together (padded)
    order: mx.array | None  # (R,) the batch row each mirror row reads its query from; None: the same order
    place: mx.array | None  # (B,) each batch row's place among the mirror rows then the alone ones; None: same
    generation: int  # the mirror's storage generation the plan was made for


class BatchMirror:
    """The mirror of one block pool's batch (see the module docstring); one thread, like the pool."""

    def __init__(self, pool: BlockPool) -> None:
        geometry = pool.geometry
        self.pool = pool
        self.kv_heads, self.num_layers = geometry.kv_heads, geometry.num_layers
        self.parts = pool.storage[0].parts()  # ((kv_heads, width), dtype) of each stored part
        self.rows: list[_Row | None] = []
        self.capacity = 0
        self.row_count = 0  # rows the storage has (``rows`` may hold more, to be grown to)
        self.layers: list[tuple[mx.array, ...]] = []  # per layer, each part (2 * rows * kv_heads * capacity, width)
        self.bytes = 0
        self.generation = 0  # bumped whenever storage is dropped
        if pool.budget is not None:
            pool.budget.pools.add(self)

    def plan(self, caches: list[PagedCache]) -> MirrorStep | None:
        """Before the batch's ``begin``: rows for ``caches`` (stale ones are filled in the pass, ``write``);
        None when the mirror cannot hold them (over its limit, or the budget has no room): the caller reads
        the pool another way."""
        lengths = [cache.offset for cache in caches]
        alone = _alone(lengths)
        mirrored = [b for b in range(len(caches)) if b not in alone]
        rows = self._assign([caches[b] for b in mirrored])
        needed = max([lengths[b] for b in mirrored]) + 1
        if len(self.rows) > self.row_count or needed > self.capacity:
            if not self._grow(len(self.rows), needed):
                return None
        stale = []  # (row, cache, from): the tokens from there on are not the row's
        for b, row in zip(mirrored, rows):
            entry, cache = self.rows[row], caches[b]
            start = 0 if entry is None else min(entry.length, cache.intact)
            if start < cache.offset:
                stale.append((row, cache, start))
        return self._step(list(zip(mirrored, rows)), [(b, caches[b]) for b in alone], lengths, stale)

    def commit(self, caches: list[PagedCache], step: MirrorStep) -> None:
        """After the batch's ``begin``: each mirrored row holds its sequence as the pass leaves it."""
        for b, row in step.mirrored:
            cache = caches[b]
            self.rows[row] = _Row(weakref.ref(cache), cache.offset + 1)
            cache.intact = cache.offset + 1  # the pass writes its new token in the row too

    def live(self, step: MirrorStep) -> bool:
        """Whether ``step`` may still be used (the budget may have taken the storage back since)."""
        return step.generation == self.generation and bool(self.layers)

    def attend(self, step: MirrorStep, index: int, q: mx.array, both: tuple[mx.array, ...]) -> Attended:
        """Layer ``index``: its new keys and values, as the pool stores them (each part (2, kv_heads, B, width)),
        written into the mirrored rows (after the tokens of stale rows copied from the pool), then the
        attention of each sequence's query (B, heads, 1, dim; scaled) over its tokens (``attend_parts``): the
        mirrored ones together, the others each over views of its blocks in the pool.

        Called once the pool's own write of the layer is queued: a copy then reads the pool's newest storage,
        and the pool's next write still finds that storage read by nothing pending, so it is made in place
        (reading it before would have either copied the pool's storage or waited for the computation to
        catch up). Float rows (one part) run without helper calls: a pass does this every layer."""
        for cache, start, where in step.fills:
            keys, values = cache.tokens(index, start)  # (1, kv_heads, tokens, width) each (per part)
            held = zip(keys, values) if isinstance(keys, tuple) else [(keys, values)]
            self._put(index, where, [mx.concatenate(list(pair)) for pair in held])
        if step.select is not None:
            both = tuple(mx.take(part, step.select, axis=2) for part in both)
        layer, shape = self.layers[index], (2, self.row_count, self.kv_heads, self.capacity, -1)
        if len(layer) == 1:
            part = mx.put_along_axis(layer[0], step.writes[0], both[0].reshape(-1, both[0].shape[-1]), axis=0)
            self.layers[index] = (part,)
            view = part.reshape(shape)
            # Each half sliced on its own: slicing both halves to the length first, then taking one, made the
            # products copy them every layer.
            segment: Segment = (view[0, :, :, :step.longest], view[1, :, :, :step.longest])
        else:  # quantized: words, scales, biases
            self._put(index, step.writes, both)
            views = [part.reshape(shape) for part in self.layers[index]]
            segment = cast(Segment, (tuple(view[0, :, :, :step.longest] for view in views),
                                     tuple(view[1, :, :, :step.longest] for view in views)))
        out, total = step.attention(q if step.order is None else q[step.order], [segment])
        if step.alone:
            parts = [_attend_alone(q[b:b + 1], cache, index) for b, cache in step.alone]
            out = mx.concatenate([out] + [o for o, _ in parts])
            total = None if total is None else mx.concatenate([total] + [t for _, t in parts if t is not None])
        if step.place is not None:
            out, total = out[step.place], None if total is None else total[step.place]
        return out, total

    def _put(self, index: int, where: Where, parts: list[mx.array] | tuple[mx.array, ...]) -> None:
        """Write parts (2, kv_heads, n, width) at their flat rows ``where`` in layer ``index``."""
        self.layers[index] = tuple(mx.put_along_axis(layer, at, part.reshape(-1, part.shape[-1]), axis=0)
                                   for layer, at, part in zip(self.layers[index], where, parts))

    def release_free_slabs(self, cached: bool = False) -> int:
        """The budget's reclaim: give the storage back (the pool is the record); bytes freed."""
        return self.drop() if cached else 0

    def reclaimable_bytes(self) -> int:
        return self.bytes

    def drop(self) -> int:
        """Give the storage back; the next plan starts afresh. Bytes freed."""
        freed, self.bytes = self.bytes, 0
        if freed and self.pool.budget is not None:
            self.pool.budget.give(freed)
        self.layers, self.rows, self.capacity, self.row_count = [], [], 0, 0
        self.generation += 1
        return freed

    # internals -------------------------------------------------------------

    def _assign(self, caches: list[PagedCache]) -> list[int]:
        """A row per cache: its own if it has one, else a row no cache of this batch holds (new ones at the end)."""
        holder: dict[int, int] = {}
        for row, entry in enumerate(self.rows):
            cache = entry.cache() if entry is not None else None
            if cache is not None:
                holder.setdefault(id(cache), row)
        held = [holder.get(id(cache)) for cache in caches]
        free = [row for row in range(len(self.rows)) if row not in set(held)]
        rows: list[int] = []
        for known in held:
            if known is None:
                if not free:
                    self.rows.append(None)
                    free.append(len(self.rows) - 1)
                known = free.pop(0)
                self.rows[known] = None  # whatever it held is gone
            rows.append(known)
        return rows

    def _grow(self, row_count: int, needed: int) -> bool:
        """Storage for ``row_count`` rows of at least ``needed`` tokens (capacity doubled where the limit
        allows, when the rows outgrow it; a row more keeps it), the rows held so far copied over (one lazy
        copy a layer: no reading of the pool)."""
        old_rows, old_capacity = self.row_count, self.capacity
        least = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
        token_bytes = self.pool.geometry.token_bytes  # keys and values of a token over every layer, as stored
        budget = self.pool.budget
        pool_size = self.pool.config.max_blocks * self.pool.block_bytes
        room = pool_size if budget is None else budget.free + self.bytes
        # Doubled only for longer rows: a sequence joining doubled it too, and twenty joining one a step
        # (a shared prompt's hits) asked for 2^20 times the tokens, until memory ran out.
        doubled = 2 * old_capacity if needed > old_capacity else old_capacity
        fits = [c for c in (max(least, doubled), max(least, old_capacity), least)
                if row_count * c * token_bytes <= room]
        if not fits:
            self.drop()
            return False
        capacity = fits[0]
        if capacity < old_capacity:  # fewer tokens a row, more rows: nothing is copied, every row is filled again
            self.rows = [None] * len(self.rows)
        size = row_count * capacity * token_bytes
        grown = []
        old: list[tuple[mx.array, ...] | None] = list(self.layers) or [None] * self.num_layers
        for layer in old:
            parts = []
            for i, ((heads, width), dtype) in enumerate(self.parts):
                new = mx.zeros((2, row_count, heads, capacity, width), dtype)
                if layer is not None and capacity >= old_capacity:
                    new[:, :old_rows, :, :old_capacity, :] = layer[i].reshape(2, old_rows, heads, old_capacity, width)
                parts.append(new.reshape(-1, width))
            grown.append(tuple(parts))
        if budget is not None:
            budget.give(self.bytes)
            budget.force(size)
        self.layers, self.capacity, self.bytes, self.row_count = grown, capacity, size, row_count
        return True

    def _flat_index(self, rows: Ints, positions: Ints) -> Where:
        """Where keys and values (2, kv_heads, n, width) flattened go: token i at ``positions[i]`` of mirror
        row ``rows[i]``; per stored part, ``put_along_axis``'s index (2 * kv_heads * n, width) into its flat
        array (made once a step, for every layer)."""
        part_head = np.arange(2)[:, None] * self.row_count + rows[None, :]  # (2, n): part, then row
        flat = ((part_head[:, None, :] * self.kv_heads + np.arange(self.kv_heads)[None, :, None]) * self.capacity
                + positions[None, None, :])
        index = mx.array(flat.reshape(-1, 1).astype(np.int32))
        return tuple(mx.broadcast_to(index, (index.shape[0], width)) for (_, width), _ in self.parts)

    def _step(self, mirrored: list[tuple[int, int]], alone: list[tuple[int, PagedCache]],
              lengths: list[int], stale: list[tuple[int, PagedCache, int]]) -> MirrorStep:
        count, batch = self.row_count, len(lengths)
        sources = [b for b, _ in mirrored]  # the mirrored batch rows
        rows = np.asarray([row for _, row in mirrored])
        news = np.asarray([lengths[b] for b in sources])  # where each new token goes in its row
        held = np.zeros(count, np.int64)
        held[rows] = news + 1
        longest = int(held.max())
        valid = (np.arange(longest)[None, :] < held[:, None])[:, None, None, :]
        order = np.zeros(count, np.int32)
        order[rows] = sources
        place = np.zeros(batch, np.int32)
        place[sources] = rows
        place[[b for b, _ in alone]] = count + np.arange(len(alone))
        identity = list(range(batch))
        fills = [(cache, start, self._flat_index(np.full(cache.offset - start, row), np.arange(start, cache.offset)))
                 for row, cache, start in stale]
        valid_rows = mx.array(valid)
        return MirrorStep(mirrored, alone, fills,
                          select=None if sources == identity else mx.array(np.asarray(sources, np.int32)),
                          writes=self._flat_index(rows, news), valid=valid_rows,
                          attention=batch_attention(valid_rows, len(self.parts) > 1), longest=longest,
                          order=None if order.tolist() == identity else mx.array(order),
                          place=None if count + len(alone) == batch and place.tolist() == identity else mx.array(place),
                          generation=self.generation)


def _alone(lengths: list[int]) -> list[int]:
    """The batch rows attended alone over the pool rather than padded together in the mirror: the longest,
    while that costs less than padding every row to them (one alone costs about ``alone_cost_keys`` more keys, a
    device profile's figure). A long chat among short ones then neither makes every row read its length nor
    fills the mirror."""
    by_length = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)  # (stable: ties in order)
    best, best_cost, extra, alone_cost = 0, len(lengths) * lengths[by_length[0]], 0, current().alone_cost_keys
    for k in range(1, len(lengths)):
        extra += lengths[by_length[k - 1]] + alone_cost
        cost = (len(lengths) - k) * lengths[by_length[k]] + extra
        if cost < best_cost:
            best, best_cost = k, cost
    return sorted(by_length[:best])


def _attend_alone(q: mx.array, cache: PagedCache, index: int) -> Attended:
    """``attend_parts`` of a row (1, heads, 1, dim; scaled) that attends alone over its blocks in the pool."""
    reads, mask = cache.read_plan(q.shape[1])
    segments = cache.pool.storage[index].read(reads)
    return attend_parts(q, segments, 1.0, mask)
