"""The running batch's keys and values kept in one array per layer between decode steps.

Attention of a batch reads every sequence's tokens as one padded array
(``batch_forward.py``). Taking that array out of the block pool in every layer
of every step copied all the batch reads, and a batch spread over several of
the pool's slabs took one copy and one score product per slab. Measured on the
embedded target, 8 sequences of ~200 tokens, CPU: the copy was 20% of a step;
over three slabs (a pool that grew while prefixes stayed cached) the 8-stream
throughput fell by a third.

The mirror keeps the copy instead: row r holds one sequence's tokens in order,
(2, rows, kv_heads, capacity, head_dim) flattened to (-1, head_dim) per layer
so that one ``put_along_axis`` writes each step's new keys and values (beside the pool's
own write: the pool stays the record). A row is filled from the pool only when
its sequence joins the batch or was changed outside it (a prompt chunk, a
rewind, a speculative run): ``PagedCache.edits`` and the length tell.

Its bytes come from the KV budget, at most ``MIRROR_LIMIT_BYTES``; when the
batch would need more, or the budget has no room, the caller gathers as
before. The budget can take the bytes back (``release_free_slabs``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcore.decode_attention import Attended, attend_batch_parts, attend_parts
from mlxcore.kv.paged import PagedCache

MIRROR_LIMIT_BYTES = 64 * 2**20  # all layers together
CAPACITY_STEP = 256  # tokens a row grows by
# A row attended on its own costs about as much as this many more keys for every row of the padded block
# (CPU, embedded target: ~8 MLX operations a layer against ~0.06 us a key and row).
ALONE_COST_KEYS = 512


@dataclass
class _Row:
    cache: weakref.ref  # the PagedCache this row copies
    edits: int  # its ``edits`` when the row was last written
    length: int  # tokens the row holds


@dataclass
class MirrorStep:
    """Where one step's sequences read and write (made by ``BatchMirror.plan``)."""

    rows: list[int]  # mirror row of each sequence, in the batch's order
    writes: mx.array  # (2 * kv_heads * B, head_dim) flat row each new key and value number goes to, in ``both``'s order
    valid: mx.array  # (R, 1, 1, longest) True where a row holds a token, the new ones included
    longest: int  # keys the rows attend to together (padded)
    alone: list[tuple[int, int, int]]  # (batch row, mirror row, length) of rows longer than that, attended alone
    order: mx.array | None  # (R,) the batch row each mirror row reads its query from; None: the same order
    inverse: mx.array | None  # (B,) each batch row's place among the mirror rows then the alone ones; None: same
    generation: int  # the mirror's storage generation the plan was made for


class BatchMirror:
    """The mirror of one block pool's batch (see the module docstring); one thread, like the pool."""

    def __init__(self, pool) -> None:
        geometry = pool.geometry
        self.pool = pool
        self.kv_heads, self.head_dim, self.dtype = geometry.kv_heads, geometry.head_dim, geometry.dtype
        self.num_layers = geometry.num_layers
        self.rows: list[_Row | None] = []
        self.capacity = 0
        self.layers: list[mx.array] = []
        self.bytes = 0
        self.generation = 0  # bumped whenever storage is made or dropped
        if pool.budget is not None:
            pool.budget.pools.add(self)

    @staticmethod
    def serves(pool) -> bool:
        """Float pools only (quantized blocks are attended as stored, never copied to float)."""
        return not pool.geometry.format.quantized

    def plan(self, caches: list[PagedCache]) -> MirrorStep | None:
        """Before the batch's ``begin``: rows for ``caches``, filled where stale; None when the mirror cannot
        hold them (over its limit, or the budget has no room): the caller reads the pool another way."""
        rows = self._assign(caches)
        needed = max(cache.offset for cache in caches) + 1
        if len(self.rows) > self._row_count() or needed > self.capacity:
            if not self._grow(len(self.rows), needed):
                return None
        stale = [(row, cache) for row, cache in zip(rows, caches)
                 if self.rows[row] is None or self.rows[row].edits != cache.edits
                 or self.rows[row].length != cache.offset]
        if stale:
            self._fill(stale)
        return self._step(rows, [cache.offset for cache in caches])

    def commit(self, caches: list[PagedCache], step: MirrorStep) -> None:
        """After the batch's ``begin``: each row holds its sequence as the pass leaves it."""
        for row, cache in zip(step.rows, caches):
            self.rows[row] = _Row(weakref.ref(cache), cache.edits, cache.offset + 1)

    def live(self, step: MirrorStep) -> bool:
        """Whether ``step`` may still be used (the budget may have taken the storage back since)."""
        return step.generation == self.generation and bool(self.layers)

    def write(self, index: int, step: MirrorStep, both: mx.array) -> None:
        """Layer ``index``'s new keys and values (2, kv_heads, B, head_dim) into their rows."""
        self.layers[index] = mx.put_along_axis(self.layers[index], step.writes, both.reshape(-1, self.head_dim), axis=0)

    def attend(self, index: int, step: MirrorStep, q: mx.array) -> Attended:
        """Attention of each sequence's query (B, heads, 1, dim; scaled) over its row (``attend_parts``)."""
        view = self.layers[index].reshape(2, self._row_count(), self.kv_heads, self.capacity, self.head_dim)
        keys, values = view[0, :, :, :step.longest], view[1, :, :, :step.longest]
        out, total = attend_batch_parts(q if step.order is None else q[step.order], [(keys, values)], 1.0, step.valid)
        if step.alone:
            parts = [attend_parts(q[b:b + 1], [(view[0, r:r + 1, :, :n], view[1, r:r + 1, :, :n])], 1.0)
                     for b, r, n in step.alone]
            out = mx.concatenate([out] + [o for o, _ in parts])
            total = None if total is None else mx.concatenate([total] + [t for _, t in parts])
        if step.inverse is not None:
            out, total = out[step.inverse], None if total is None else total[step.inverse]
        return out, total

    def release_free_slabs(self, cached: bool = False) -> int:
        """The budget's reclaim: give the storage back (the pool is the record); bytes freed."""
        return self.drop() if cached else 0

    def drop(self) -> int:
        """Give the storage back; the next plan starts afresh. Bytes freed."""
        freed, self.bytes = self.bytes, 0
        if freed and self.pool.budget is not None:
            self.pool.budget.give(freed)
        self.layers, self.rows, self.capacity = [], [], 0
        self.generation += 1
        return freed

    # internals -------------------------------------------------------------

    def _row_count(self) -> int:
        return self.layers[0].shape[0] // (2 * self.kv_heads * self.capacity) if self.layers else 0

    def _assign(self, caches: list[PagedCache]) -> list[int]:
        """A row per cache: its own if it has one, else a row no cache of this batch holds (new ones at the end)."""
        holder = {}
        for row, entry in enumerate(self.rows):
            cache = entry.cache() if entry is not None else None
            if cache is not None:
                holder.setdefault(id(cache), row)
        rows = [holder.get(id(cache)) for cache in caches]
        free = [row for row in range(len(self.rows)) if row not in set(rows)]
        for i, row in enumerate(rows):
            if row is None:
                if not free:
                    self.rows.append(None)
                    free.append(len(self.rows) - 1)
                rows[i] = free.pop(0)
                self.rows[rows[i]] = None  # whatever it held is gone
        return rows

    def _grow(self, row_count: int, needed: int) -> bool:
        """New storage for ``row_count`` rows of at least ``needed`` tokens (every row to be filled again)."""
        capacity = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
        token_bytes = 2 * self.kv_heads * self.head_dim * self.dtype.size
        size = self.num_layers * row_count * capacity * token_bytes
        budget = self.pool.budget
        if size > MIRROR_LIMIT_BYTES or (budget is not None and size - self.bytes > budget.free):
            self.drop()
            return False
        kept = self.rows
        self.drop()
        self.rows = [None] * len(kept)
        shape = (2 * row_count * self.kv_heads * capacity, self.head_dim)
        self.layers = [mx.zeros(shape, self.dtype) for _ in range(self.num_layers)]
        self.capacity, self.bytes = capacity, size
        if budget is not None:
            budget.force(size)
        return True

    def _fill(self, stale: list[tuple[int, PagedCache]]) -> None:
        """Copy each stale row's sequence from the pool, every layer, and compute it now (the pool's next
        write then finds its storage unread, and is made in place)."""
        for index in range(self.num_layers):
            for row, cache in stale:
                if cache.offset:
                    keys, values = cache.layers[index].state  # (1, kv_heads, n, dim) each
                    where = self._flat_rows(row, np.arange(cache.offset)).reshape(-1)
                    self.layers[index][mx.array(where)] = mx.concatenate([keys, values]).reshape(-1, self.head_dim)
        mx.eval(self.layers)
        for row, cache in stale:
            self.rows[row] = _Row(weakref.ref(cache), cache.edits, cache.offset)

    def _flat_rows(self, row: int, positions: np.ndarray) -> np.ndarray:
        """(2, kv_heads, len(positions)) flat rows of ``row``'s keys and values at ``positions``."""
        count = self._row_count()
        part_head = np.arange(2)[:, None] * count * self.kv_heads + row * self.kv_heads + np.arange(self.kv_heads)
        return (part_head[:, :, None] * self.capacity + positions[None, None, :]).astype(np.int32)

    def _step(self, rows: list[int], lengths: list[int]) -> MirrorStep:
        count = self._row_count()
        part_head = (np.arange(2)[:, None] * count * self.kv_heads + np.arange(self.kv_heads))[:, :, None]  # (2, kv, 1)
        writes = (part_head + np.asarray(rows)[None, None, :] * self.kv_heads) * self.capacity + np.asarray(lengths)
        writes = mx.broadcast_to(mx.array(writes.reshape(-1, 1).astype(np.int32)), (writes.size, self.head_dim))
        held = np.zeros(count, np.int64)
        held[rows] = np.asarray(lengths) + 1
        longest, alone_rows = _padded_length(held[rows].tolist(), count)
        alone = [(b, rows[b], int(held[rows[b]])) for b in alone_rows]
        valid = (np.arange(longest)[None, :] < held[:, None])[:, None, None, :]
        order = np.zeros(count, np.int32)
        order[rows] = np.arange(len(rows))
        place = np.asarray(rows, np.int32)
        place[alone_rows] = count + np.arange(len(alone_rows))
        same = rows == list(range(count)) and not alone
        return MirrorStep(rows, writes, mx.array(valid), longest, alone,
                          None if rows == list(range(count)) else mx.array(order),
                          None if same else mx.array(place), self.generation)


def _padded_length(lengths: list[int], row_count: int) -> tuple[int, list[int]]:
    """(keys the mirror's ``row_count`` rows attend to together, the batch rows attended alone): the longest
    rows go alone while that costs less than padding every row to them (one alone costs about
    ``ALONE_COST_KEYS`` more keys). A long chat among short ones then no longer makes every row read its length."""
    by_length = sorted(range(len(lengths)), key=lambda b: -lengths[b])
    best, best_cost, extra = 0, row_count * lengths[by_length[0]], 0
    for k in range(1, len(lengths)):
        extra += lengths[by_length[k - 1]] + ALONE_COST_KEYS
        cost = row_count * lengths[by_length[k]] + extra
        if cost < best_cost:
            best, best_cost = k, cost
    return lengths[by_length[best]], by_length[:best]
