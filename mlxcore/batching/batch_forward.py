"""One decode step for several paged sequences at once: one forward pass over the batch.

Every layer runs once for the whole batch: the norms, projections, RoPE (at
each sequence's own position) and MLP on a (B, 1, hidden) input, in the
compiled halves of ``CompiledForward``. Around attention each sequence is its
own: its new key and value go to the slot its block table names (one put per
slab for the whole batch), and it attends over its own tokens. Prompt chunks
joining the batch (``prompt_feed.py``) are more rows in the layers they go
through this step, each attending causally over its own sequence. The decoding
rows read their keys and values one of three ways:

- mirrored (float pools, two or more sequences, within the mirror's limit):
  the batch's keys and values kept between steps in one array per layer
  (``batch_mirror.py``), one attention padded to the common length; a much
  longer sequence attends alone over views of its blocks;
- gathered: each slab's keys and values of every sequence are taken with one
  ``mx.take`` into a (B, kv_heads, longest, dim) array padded with a mask, and
  one attention serves the batch. Its cost is a copy of what attention reads,
  so it is taken while that is small (short chats; the profile's ``gather_limit_bytes``);
- per sequence: each sequence attends over views of its runs of blocks
  (``decode_attention.attend``), no copy, a few operations per sequence.

What each way costs, measured: docs/decisions.md ("Batching: the mirror")."""

from __future__ import annotations

import itertools
from collections import defaultdict

import mlx.core as mx
import numpy as np

from mlxcore.batching.batch_mirror import BatchMirror, MirrorStep
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.kv.base import feed_one
from mlxcore.compiled_forward import CompiledForward
from mlxcore.decode_attention import Attended, attend, attend_batch_parts, normalized
from mlxcore.device_profile import current
from mlxcore.errors import ModelLoadError
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.slab_storage import LayerStorage


class BatchDecoder:
    """Feeds one token to each of several sequences of one pool; ``forward`` must be split (Qwen3, Qwen3-MoE) for that."""

    def __init__(self, forward: CompiledForward) -> None:
        self.forward = forward
        self.mirror: BatchMirror | None = None

    def __call__(self, caches: list[PagedCache], ids: list[int | None], inputs: mx.array | None,
                 feeds: list[PromptFeed] = ()) -> mx.array | None:
        """Logits (B, V) of the next token of each sequence after ``inputs`` (B,) int32 (None for no B).

        ``ids`` are the same tokens as known ids (None where the value is not read yet: tell it with
        ``cache.known`` afterwards), recorded as each cache's tokens.
        ``feeds``: prompt chunks joining the batch (``prompt_feed.py``), each taken through the layers
        this step's plan gave it: in those layers its tokens are rows beside the decoding ones, at their
        own positions, attending causally over their own sequence; its hidden state waits for the next
        pass where it stops short of the last layer. Every layer's weights serve all its rows at once.
        """
        if not self.forward.split:  # a model whose layers this module cannot run split (a lone reply runs it whole)
            kind = getattr(self.forward.args, "model_type", "this")
            raise ModelLoadError(f"Replies side by side run Qwen3 and Qwen3-MoE models; this is a {kind} model.")
        everyone = [*caches, *(feed.cache for feed in feeds)]
        pool = everyone[0].pool
        if any(cache.pool is not pool for cache in everyone):
            raise ValueError("A batch's sequences must share one block pool.")
        rows = len(caches)
        offsets = mx.array([cache.offset for cache in caches], dtype=mx.int32)  # each one's next position
        reads = self._reads(pool, caches, ids) if rows else None
        h = self.forward.model.embed_tokens(inputs[:, None]) if rows else None  # (B, 1, hidden): a row a sequence
        writes: dict[tuple, tuple[SlotWrites, mx.array, list[int]]] = {}  # per set of chunks riding along
        for index, layer in enumerate(self.forward._layers):
            joining = [feed for feed in feeds if feed.runs(index)] if feeds else []
            if not joining and not rows:
                continue
            key = tuple(id(feed) for feed in joining)
            if key not in writes:  # the layers a set of chunks rides in share its slots, positions and rows
                starts = list(itertools.accumulate([rows] + [len(feed.ids) for feed in joining]))
                where = mx.concatenate([offsets] + [feed.offsets for feed in joining]) if joining else offsets
                writes[key] = SlotWrites(caches, [feed.cache for feed in joining]), where, starts
            slots, where, starts = writes[key]
            x = mx.concatenate(([h] if rows else []) + [feed.h for feed in joining]) if joining else h
            q, both = layer.before_batch(x, where)  # (rows, heads, 1, dim) scaled; (2, kv_heads, rows, dim)
            storage = pool.storage[index]
            written = slots.apply(storage, both)
            if joining:
                outs = [feed.attend(q[start:start + len(feed.ids)], index) for feed, start in zip(joining, starts)]
                if rows:
                    reads.write(index, both[:, :, :rows])
                    outs.insert(0, normalized(reads.attend(storage, index, q[:rows]), q[:rows].shape))
                x = layer.after(x, (outs[0] if len(outs) == 1 else mx.concatenate(outs), None))
                for feed, start in zip(joining, starts):
                    feed.h = x[start:start + len(feed.ids)]
                h = x[:rows] if rows else None
            else:
                reads.write(index, both)
                h = x = layer.after(x, reads.attend(storage, index, q))
            # Start this layer while the next one's graph is built (MLX's CPU queue is short); the pool's
            # write too, which a pass reading the mirror does not depend on: left lazy, writes would pile up.
            mx.async_eval(x, written)
        for cache in caches:
            cache.finish_batched_pass()
        return self.forward._head(h)[:, -1, :] if rows else None

    def _reads(self, pool, caches: list[PagedCache], ids: list[int | None]) -> _Reads | _MirrorReads:
        """Announce each sequence's one token; how the batch reads its keys and values this pass."""
        mirror = self._mirror(pool, caches)
        step = mirror.plan(caches) if mirror is not None else None
        for cache, token in zip(caches, ids):
            feed_one(cache, token)
        if step is not None and mirror.live(step):  # a begin may have made the budget take the mirror back
            mirror.commit(caches, step)
            return _MirrorReads(mirror, step)
        return _Reads(caches, pool.geometry.token_bytes // pool.geometry.num_layers)

    def _mirror(self, pool, caches: list[PagedCache]) -> BatchMirror | None:
        """The pool's mirror of the batch, for two or more sequences of a float pool (``batch_mirror.py``)."""
        if len(caches) < 2 or not BatchMirror.serves(pool):
            return None
        if self.mirror is None or self.mirror.pool is not pool:
            self.release()
            self.mirror = BatchMirror(pool)
        return self.mirror

    def release(self) -> None:
        """Give the mirror's memory back (nothing decodes now); the next batch fills it again."""
        if self.mirror is not None:
            self.mirror.drop()


class SlotWrites:
    """Where each row's key and value go: per slab, the slots and the rows that write them (a prompt
    chunk's cache: one row per token it announced, after the decode rows)."""

    def __init__(self, caches: list[PagedCache], chunks: list[PagedCache] = ()) -> None:
        groups: dict[int, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        places = [cache.write_slot() for cache in caches] + [at for chunk in chunks for at in chunk.write_slots()]
        for row, (slab, at) in enumerate(places):
            groups[slab][0].append(at)
            groups[slab][1].append(row)
        everyone = len(places)
        self.groups = [(slab, mx.array(slots).reshape(1, 1, -1, 1), None if len(rows) == everyone else mx.array(rows))
                       for slab, (slots, rows) in groups.items()]

    def apply(self, storage: LayerStorage, both: mx.array) -> list[mx.array]:
        """Scatter keys and values (2, kv_heads, R, dim) into their slots; the slabs' new arrays."""
        for slab, slots, rows in self.groups:
            storage.scatter(slab, slots, both if rows is None else mx.take(both, rows, axis=2))
        return [part for slab, _, _ in self.groups for part in storage.slabs[slab]]


class _Reads:
    """How the batch's sequences read their tokens in attention (see the module docstring)."""

    def __init__(self, caches: list[PagedCache], layer_token_bytes: int) -> None:
        self.caches = caches
        runs = [cache.read_runs() for cache in caches]  # (slab, first slot, slots), the new token included
        longest: dict[int, int] = defaultdict(int)
        for table in runs:
            for slab, count in _per_slab(table).items():
                longest[slab] = max(longest[slab], count)
        gathered = len(caches) * sum(longest.values()) * layer_token_bytes
        self.gather = gathered <= current().gather_limit_bytes and len(caches) > 1
        if self.gather:
            self.slabs = sorted(longest)
            self.slots, valid = self._layout(runs, longest)
            self.valid = mx.array(valid)
            self._rows: dict[int, list[mx.array]] = {}

    def _layout(self, runs: list[list[tuple[int, int, int]]], longest: dict[int, int]):
        """Per slab, the slot of each (sequence, position) (padding: slot 0); validity over all slabs' positions."""
        slots = {slab: np.zeros((len(runs), longest[slab]), np.int32) for slab in self.slabs}
        valid = [np.zeros((len(runs), longest[slab]), bool) for slab in self.slabs]
        for row, table in enumerate(runs):
            filled: dict[int, int] = defaultdict(int)
            for slab, first, count in table:
                at = filled[slab]
                slots[slab][row, at:at + count] = np.arange(first, first + count)
                valid[self.slabs.index(slab)][row, at:at + count] = True
                filled[slab] += count
        return slots, np.concatenate(valid, axis=1)[:, None, None, :]

    def write(self, index: int, both: mx.array) -> None:
        """Nothing: the pool holds what this reads."""

    def attend(self, storage: LayerStorage, index: int, q: mx.array) -> Attended:
        """Attention of each sequence's query (B, heads, 1, dim; scaled) over its tokens (``attend_parts``)."""
        if not self.gather:
            return mx.concatenate([_attend_own(q[row:row + 1], cache, index)
                                   for row, cache in enumerate(self.caches)], axis=0), None
        segments = []
        for slab in self.slabs:
            _, heads, capacity, _ = storage.slabs[slab][0].shape
            segments.append(storage.take(slab, self._slab_rows(slab, heads, capacity)))  # (B, kv_heads, longest, ..) x2
        return attend_batch_parts(q, segments, 1.0, self.valid)

    def _slab_rows(self, slab: int, heads: int, capacity: int) -> mx.array:
        """Rows of the (2 * kv_heads * capacity, dim) view of a slab that each sequence reads; made once a step."""
        key = (slab, heads, capacity)
        if key not in self._rows:
            slots = self.slots[slab]  # (B, longest)
            heads_rows = np.arange(2 * heads, dtype=np.int32).reshape(2, 1, heads, 1) * capacity
            self._rows[key] = mx.array(heads_rows + slots[None, :, None, :])  # (2, B, kv_heads, longest)
        return self._rows[key]


class _MirrorReads:
    """The batch reads its tokens from the mirror, which each layer's new keys and values are also written to."""

    def __init__(self, mirror: BatchMirror, step: MirrorStep) -> None:
        self.mirror, self.step = mirror, step

    def write(self, index: int, both: mx.array) -> None:
        self.mirror.write(index, self.step, both)

    def attend(self, storage: LayerStorage, index: int, q: mx.array) -> Attended:
        return self.mirror.attend(index, self.step, q)


def _attend_own(q: mx.array, cache: PagedCache, index: int) -> mx.array:
    """One sequence's query (1, heads, 1, dim; scaled) over its own tokens in layer ``index``."""
    segments, seen = cache.layer_read(index)
    return attend(q, segments, 1.0, seen)


def _per_slab(table: list[tuple[int, int, int]]) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for slab, _, count in table:
        counts[slab] += count
    return counts
