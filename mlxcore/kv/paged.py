"""The ``paged`` kind: one sequence's block table in a shared ``BlockPool``.

``PagedCache.begin(count)`` makes room for ``count`` tokens in the sequence's
block table (new blocks, copy-on-write of a shared partial tail) and keeps the
resulting plan; each layer then writes its keys and values where the plan says, and the pass commits
the sequence's one length (``offset``) at its end: the batched pass once for every layer
(``finish_batched_pass``), mlx-lm's per-layer protocol with its last layer. A layer's ``offset`` is read
from that length; nothing a pass left uncommitted is held (``settle`` drops it).
``hash_blocks(ids)``, once the owner knows the ids and every layer holds them,
makes the full blocks prefix hits. Attention reads the sequence where it lies (``read_plan``, after the
batched pass wrote a layer's rows): one view of storage per run of adjacent blocks (a lone chat has one run
per slab it spans; a fork, a shared prefix or a restored session a few more),
which ``decode_attention.py`` and ``cpu_attention.py`` attend over without
joining them; runs that lie in one slab with small gaps between them as one view
over all those slots, with a mask that hides the gaps (``Gather.span``), unless
the CPU's key blocks will read them (``cpu_attention.reads_spans``); past the
profile's ``max_segments`` runs, one copy. ``update_and_fetch`` (mlx-lm's protocol, for attention that needs
one array) returns a view when there is one run, else a copy made for that call.

Every forward pass needs ``begin(count)`` first (mlx-lm's own generate loop does
not call it, so it cannot drive this kind); a pass without it raises
``CacheStateError``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import create_attention_mask

from mlxcore.cpu_attention import reads_spans
from mlxcore.device_profile import current
from mlxcore.kv.base import CacheMeta, ModelCache, Tensors, layer_tensors, saved_layer
from mlxcore.kv.block_manager import AppendPlan
from mlxcore.kv.errors import CacheShapeError, CacheStateError, KVCacheError, PoolExhaustedError, TrimError
from mlxcore.kv.geometry import KVGeometry
from mlxcore.kv import stored
from mlxcore.kv.kv_format import KVFormat, kv_format
from mlxcore.kv.paged_pool import BlockPool, make_block_pool
from mlxcore.kv.protocol import Mask
from mlxcore.kv.slab_storage import Gather, Reads

def _as_float(parts: Sequence[mx.array], fmt: KVFormat, geometry: KVGeometry) -> tuple[mx.array, mx.array]:
    """Saved keys and values as float arrays of the geometry's dtype."""
    if not fmt.quantized:
        return parts[0].astype(geometry.dtype), parts[1].astype(geometry.dtype)
    keys, values = (mx.dequantize(w, scales, biases, group_size=fmt.group_size, bits=fmt.bits).astype(geometry.dtype)
                    for w, scales, biases in (parts[:3], parts[3:]))
    return keys, values
Span = tuple[tuple[int, int, int], mx.array]
NO_BEGIN = "Paged KV cache: a batched pass needs begin(1) first."  # (slab, start, size) of one view, and its (queries, slots) mask

class PagedLayerCache:
    """One layer's view of a paged sequence; follows ``LayerCache``. Made by ``PagedCache``."""

    def __init__(self, owner: PagedCache, index: int) -> None:
        self._owner, self.index = owner, index

    @property
    def offset(self) -> int:
        """Tokens this layer holds: the sequence's committed length, and the tokens announced once this layer
        wrote them (mlx-lm's model writes its layers one by one)."""
        owner = self._owner
        plan = owner._plan
        return owner.offset + plan.length if plan is not None and self.index < owner._written else owner.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write (1, kv_heads, L, head_dim) keys/values of the tokens ``begin`` announced; return the whole sequence."""
        self._owner._write_layer(self, keys, values)
        return self._owner.tokens(self.index)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Mask:
        mask: Mask = create_attention_mask(N, offset=self.offset, return_array=return_array, window_size=window_size)
        return mask

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """mlx-lm's trim, a layer at a time (``trim_prompt_cache`` trims every layer in order): a paged
        sequence's layers hold one length, so the sequence is trimmed with its last layer."""
        if not 0 <= n <= self.offset:
            raise TrimError(f"Paged KV cache: cannot trim {n} of {self.offset} tokens.")
        if self.index == len(self._owner.layers) - 1:
            self._owner.trim(n)
        return n

    @property
    def state(self) -> tuple[mx.array, mx.array]:
        """This layer's keys and values in token order, (1, kv_heads, offset, head_dim) each."""
        return self._owner.tokens(self.index)

    @property
    def meta_state(self) -> tuple[str, ...]:
        return ("paged", str(self.offset))

    @property
    def nbytes(self) -> int:
        """Bytes of this sequence's blocks in this layer (shared blocks counted in every sequence)."""
        blocks = len(self._owner.pool.manager.block_ids(self._owner.seq_id))
        return blocks * self._owner.pool.block_bytes // len(self._owner.layers)


class QuantizedPagedLayerCache(PagedLayerCache):
    """A layer of a paged sequence whose keys and values are quantized (``kv_format.py``): ``bits`` and
    ``group_size`` tell mlx-lm's attention to read the (packed, scales, biases) that ``update_and_fetch``
    returns as they are."""

    def __init__(self, owner: PagedCache, index: int) -> None:
        super().__init__(owner, index)
        fmt = owner.pool.geometry.format
        self.bits, self.group_size = fmt.bits, fmt.group_size


class PagedCache(ModelCache):
    """A sequence in a ``BlockPool``: prefix sharing, copy-on-write forks, block-exact trims."""

    kind = "paged"
    offset = 0  # an attribute here (the sequence's committed length), not the layers' property

    def __init__(self, pool: BlockPool, seq_id: int | None = None) -> None:
        """A new empty sequence in ``pool``, or (``seq_id``) one the pool's manager already holds."""
        self.pool, self.geometry = pool, pool.geometry
        self.seq_id = pool.manager.new_sequence() if seq_id is None else seq_id
        layer_kind = QuantizedPagedLayerCache if pool.geometry.format.quantized else PagedLayerCache
        self.layers: list[PagedLayerCache] = [layer_kind(self, i) for i in range(pool.geometry.num_layers)]
        self.offset = pool.manager.length(self.seq_id)  # tokens every layer holds: what the last pass committed
        self._plan: AppendPlan | None = None  # the pass under way (``begin``)
        self._written = 0  # layers that wrote its tokens one by one (mlx-lm's per-layer protocol)
        self._gather: Gather | None = None  # the table's runs, made again when the table changes
        self._span: tuple[tuple[int, int], Span | None] | None = None  # ((length, queries), span and mask) of this pass
        self._reads: tuple[Reads, Mask] | None = None  # this pass's (``read_plan``)
        # Leading tokens unchanged since the batch's mirror last copied the sequence (it sets this): a change
        # lowers it to where the change starts, so the copy takes again only the tokens from there.
        self.intact = 0
        self._hashed_full = -1  # full blocks when ``hash_blocks`` last hashed (-1: since the table changed)
        # Its last prefix lookup's blocks read back from the disk tier: tokens, and seconds spent reading them.
        self.disk_read_tokens, self.disk_read_seconds = 0, 0.0
        # Give the blocks back when the cache is garbage collected without release().
        weakref.finalize(self, pool.drop_sequence, self.seq_id)

    def reuse_prefix(self, ids: Sequence[int]) -> int:
        self.settle()
        self.intact = 0
        reused = self.offset = self.pool.manager.reuse_prefix(self.seq_id, ids)
        self._table_changed()
        self.disk_read_tokens, self.disk_read_seconds = 0, 0.0
        if self.pool.disk is not None:  # the blocks that follow, read back from the disk tier if it has them
            reused += self.pool.disk.read_into(self, ids, reused)
        return reused

    def fork(self) -> PagedCache:
        self.settle()
        return PagedCache(self.pool, self.pool.manager.fork(self.seq_id))

    def release(self, ids: Sequence[int] = ()) -> None:
        if ids:
            self.hash_blocks(ids)
        self._plan = None
        self.intact = 0
        self.pool.manager.release(self.seq_id)
        self._table_changed()
        self.offset = 0
        self.pool.release_free_slabs()

    def state_dict(self, ids: Sequence[int]) -> tuple[Tensors, CacheMeta]:
        """Only this sequence's tokens, in order (not whole blocks, not other sequences'); quantized blocks
        as they are stored (``stored.tensor_names``), so a file holds the same bytes as the pool."""
        self.settle()
        fmt = self.pool.geometry.format
        arrays = [stored.flat(*self.tokens(index)) for index in range(len(self.layers))] if self.offset else []
        meta: CacheMeta = {"kind": self.kind, "tokens": self.held_ids(ids), "block_size": self.pool.block_size,
                "kv_format": fmt.name, "kv_bits": fmt.bits, "group_size": fmt.group_size}
        return layer_tensors(stored.tensor_names(fmt), arrays), meta

    @classmethod
    def _restore(cls, model: nn.Module, tensors: Tensors, meta: CacheMeta, pool: BlockPool | None) -> PagedCache:
        pool = pool or make_block_pool(model, block_size=int(meta.get("block_size", 16)), kv_bits=meta.get("kv_bits"))
        cache, ids = cls(pool), [int(t) for t in meta.get("tokens", [])]
        if not ids:
            return cache
        try:
            cache._write_saved(tensors, ids, meta.get("kv_bits"))
        except KVCacheError:
            cache.release()
            raise
        return cache

    def _write_saved(self, tensors: Tensors, ids: list[int], saved_bits: int | None = None) -> None:
        """Write a saved sequence's keys and values (float, or quantized as ``saved_bits``) into its blocks:
        as they are when the pool stores the same format, else through float."""
        saved_format = kv_format(saved_bits, self.pool.geometry.head_dim)
        names = stored.tensor_names(saved_format)
        saved = [saved_layer(tensors, layer.index, names) for layer in self.layers]
        if any(parts[0].shape[2:3] != (len(ids),) for parts in saved):
            raise CacheStateError("Saved paged KV state: tensor length and token count differ.")
        reused = self.reuse_prefix(ids)  # blocks another session already holds are shared, not copied
        self.begin(len(ids) - reused)
        same = saved_format == self.pool.geometry.format
        for layer, layer_parts in zip(self.layers, saved):
            parts = [part[..., reused:, :] for part in layer_parts]
            if same:
                self.write_stored(layer, parts)
            else:
                keys, values = _as_float(parts, saved_format, self.pool.geometry)
                self._write_layer(layer, keys, values)
        mx.eval([s.arrays for s in self.pool.storage])
        self.hash_blocks(ids)

    def write_stored(self, layer: PagedLayerCache, parts: list[mx.array]) -> None:
        """Write keys and values already in the pool's format: keys' parts, then values' (1, kv_heads, L, w)
        (a restored session, blocks read back from disk)."""
        half = len(parts) // 2
        both = [mx.concatenate([k, v], axis=0) for k, v in zip(parts[:half], parts[half:])]
        plan = self._plan
        assert plan is not None, "_write_saved calls begin first"
        self.pool.storage[layer.index].write_parts(plan.segments, tuple(both))
        self._wrote(layer)

    # a batched pass (mlxcore/batching/batch_forward.py) writes and reads for every layer itself ----------

    def write_slots(self) -> list[tuple[int, int]]:
        """(slab, slot in the slab) of each token ``begin`` announced, in order."""
        plan, slab_slots, slots = self._plan, self.pool.slab_slots, []
        if plan is None or self._written:  # (checked here: a pass calls this for every sequence)
            raise CacheStateError(NO_BEGIN)
        for seg in plan.segments:
            for slot in range(seg.slot, seg.slot + seg.length):
                slots.append(divmod(slot, slab_slots))
        return slots

    def read_plan(self, heads: int) -> tuple[Reads, Mask]:
        """Where this pass's attention reads the sequence, the announced tokens included, for the causal
        attention of the announced ones in ``heads`` query heads, and its mask; found once a pass, and every
        layer reads its own storage there (``LayerStorage.read``). The places are (slab, start, size) views:
        the runs, or one span over runs in one slab with small gaps between them when the device attends with
        an array mask (``cpu_attention.reads_spans``); past the profile's ``max_segments`` runs, (the table,
        length): one copy."""
        if self._reads is not None:
            return self._reads
        plan = self._plan
        if plan is None or self._written:
            raise CacheStateError(NO_BEGIN)
        length, queries = plan.start + plan.length, plan.length
        rows = heads // self.pool.geometry.kv_heads * queries  # query rows per kv head
        gather = self._gather_index()
        # (a span joins runs: one run, most chats' case, is read as it is)
        span = self._span_mask(length, queries) if len(gather.runs) > 1 and reads_spans(rows, length) else None
        reads: tuple[Reads, Mask]
        if span is not None:
            reads = [span[0]], span[1]
        elif len(gather.runs) > current().max_segments:
            reads = (gather, length), "causal"
        else:
            reads = gather.places(length), "causal"
        self._reads = reads
        return reads

    def finish_batched_pass(self) -> None:
        """Every layer holds the announced tokens now (written by a batched pass)."""
        plan = self._plan
        if plan is None or self._written:
            raise CacheStateError(NO_BEGIN)
        self.offset = plan.start + plan.length  # committed, once for every layer
        self._plan, self._written, self._reads = None, 0, None

    def hash_blocks(self, ids: Sequence[int]) -> None:
        """Full blocks among the tokens every layer holds become prefix hits (a chunk on its way through the
        layers, ``prompt_feed.py``, is held by none until the last writes it)."""
        full = min(len(ids), self.offset) // self.pool.block_size
        if full != self._hashed_full:  # (a reply calls this a token; a block fills every block_size tokens)
            self._hashed_full = full
            self.pool.manager.hash_blocks(self.seq_id, ids, self.offset)

    # internals -------------------------------------------------------------

    def begin(self, count: int) -> None:
        """``ModelCache.begin`` in one call (a pass begins every sequence it feeds): what no pass committed is
        dropped, and the table takes ``count`` more tokens (``PoolExhaustedError``, nothing changed, when the
        pool cannot)."""
        if self._plan is not None:
            self.settle()
        self.intact = min(self.intact, self.offset)  # its tokens are written from there
        try:  # raises before any change if the pool is full
            plan = self.pool.manager.append(self.seq_id, count, self.pool.make_room)
        except PoolExhaustedError:
            raise PoolExhaustedError(self.pool.full_message(count)) from None
        if plan.new_blocks or plan.copies:  # (most appends fill the tail block: the table is as it was)
            self.pool.save_leaving()  # blocks it evicted, to disk before their slots are written
            self._table_changed()
            self.pool.copy_blocks(plan.copies)
            self.pool.ensure()
        self._plan, self._written, self._reads = plan, 0, None

    _begin = begin  # (a hybrid cache begins its attention part so)

    def settle(self) -> None:
        """Drop what a pass did not commit: a ``begin`` without (or with half) a forward pass."""
        if self._plan is None:  # no pass under way: the table fits the committed length
            return
        self._plan, self._written, self._reads = None, 0, None
        self._sync_table()

    def trim(self, n: int) -> int:
        """Remove the last ``n`` tokens (``TrimError``, nothing changed, if there are fewer); the block table
        follows."""
        self.settle()
        if not 0 <= n <= self.offset:
            raise TrimError(f"Cannot rewind the paged KV cache by {n} tokens: it holds {self.offset}.")
        if n:
            self.offset -= n
            self.intact = min(self.intact, self.offset)
            self._hashed_full = -1  # a block it refills is hashed again
            self._sync_table()
        return n

    def _sync_table(self) -> None:
        """Trim the block table to the committed length."""
        manager = self.pool.manager
        excess = manager.length(self.seq_id) - self.offset
        if excess > 0 and self._plan is None:
            blocks = len(manager.block_ids(self.seq_id))
            manager.trim(self.seq_id, excess)
            if len(manager.block_ids(self.seq_id)) != blocks:
                self._table_changed()

    def _table_changed(self) -> None:
        """Blocks were added, copied, attached or given back: the views of the table are made again."""
        self._gather = self._span = self._reads = None
        self._hashed_full = -1

    def _write_layer(self, layer: PagedLayerCache, keys: mx.array, values: mx.array) -> None:
        plan = self._plan
        if plan is None or layer.index != self._written:
            raise CacheStateError("Paged KV cache: call begin(count) before each forward pass.")
        try:
            self.pool.geometry.check(keys, values, "paged KV cache")
            if keys.shape[2] != plan.length:
                raise CacheShapeError(f"paged KV cache: begin announced {plan.length} tokens, "
                                      f"the forward pass feeds {keys.shape[2]}.")
        except CacheShapeError:
            self.settle()  # undo the begin: the cache is left as it was
            raise
        self.pool.storage[layer.index].write(plan.segments, keys, values)
        self._wrote(layer)

    def _wrote(self, layer: PagedLayerCache) -> None:
        """``layer`` holds the announced tokens; with the last layer the pass commits them."""
        plan = self._plan
        assert plan is not None and layer.index == self._written  # (the writers checked)
        self._written += 1
        if self._written == len(self.layers):
            self.offset = plan.start + plan.length
            self._plan, self._written, self._reads = None, 0, None

    def tokens(self, index: int, start: int = 0) -> tuple:
        """Layer ``index``'s keys and values from position ``start`` to what it holds, in token order, (1,
        kv_heads, tokens, width) each: a view of storage when one run of blocks holds them, else a copy (the
        batch's mirror takes a sequence's tail so)."""
        return self.pool.storage[index].fetch(self._gather_index(), self.layers[index].offset, start)

    def _span_mask(self, length: int, queries: int) -> Span | None:
        """``Gather.span`` of the first ``length`` tokens with its (queries, slots) mask, made once a pass."""
        key = (length, queries)
        if self._span is None or self._span[0] != key:
            found = self._gather_index().span(length)
            span: Span | None = None
            if found is not None:
                run, positions = found
                last = np.arange(length - queries, length)[:, None]  # query i's own position
                span = run, mx.array((positions >= 0) & (positions <= last))
            self._span = (key, span)
        return self._span[1]

    def _gather_index(self) -> Gather:
        if self._gather is None:
            self._gather = Gather(self.pool.manager.block_ids(self.seq_id), self.pool.block_size,
                                  self.pool.config.slab_blocks)
        return self._gather
