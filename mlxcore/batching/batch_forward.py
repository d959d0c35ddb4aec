"""One decode step for several paged sequences at once: one forward pass over the batch.

Every layer runs once for the whole batch: the norms, projections, RoPE (at
each sequence's own position) and MLP on a (B, 1, hidden) input, in the
compiled halves of ``CompiledForward``. Around attention each sequence is its
own: its new key and value go to the slot its block table names (one put per
slab for the whole batch), and it attends over its own tokens. Prompt chunks
joining the batch (``prompt_feed.py``) are more rows in every layer, each
attending causally over its own sequence; with no
decoding row, a pass of prompt rows alone runs the layers uncompiled (a
prompt's chunk lengths vary: each new row count would compile anew); such a pass
also reads a prompt on a cache of one sequence (rotating, standard), whose layers
write its keys and values instead of the pool. The decoding
rows read their keys and values one of two ways:

- mirrored (two or more sequences, while the KV budget has room): the batch's
  keys and values kept between steps in one array per layer
  (``batch_mirror.py``), one attention padded to the common length; a much
  longer sequence attends alone over views of its blocks;
- per sequence: each sequence attends over views of its runs of blocks
  (``decode_attention.attend``), no copy, a few operations per sequence.

What each way costs: docs/decisions.md ("Batching: the mirror", "The running batch on a GPU").

A pass of decoding replies' rows alone (a lone reply's decode row, verifications, a draft's), each reply's
tokens in one place of float storage, writes and attends each layer in a few MLX operations, with no Python
call (``_runs``, ``decode_attention.run_attention``): what a lone reply's token costs in Python is its
step, not its layers.
"""

from __future__ import annotations

from functools import partial
from collections.abc import Callable, Sequence

import mlx.core as mx

from mlxcore.batching.batch_mirror import BatchMirror
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.compiled_forward import CompiledForward
from mlxcore.decode_attention import Attended, Attention, attention_for, grouped_mask, normalized, run_attention
from mlxcore.device_profile import current
from mlxcore.errors import ModelLoadError
from mlxcore.kv.base import ModelCache
from mlxcore.kv.geometry import model_geometry
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.paged_pool import BlockPool, make_block_pool
from mlxcore.kv.protocol import Mask
from mlxcore.kv.slab_storage import Reads, SlotGroup
from mlxcore.kv.standard import StandardCache

# Row counts whose kernels a warm-up builds: a lone decode row, and two rows, whose kernels every other count
# reuses (measured on the embedded target: 18 kernels for one, 8 more for two, none after).
WARM_UP_ROWS = (1, 2)


# How a pass's decode rows read their tokens in a layer: (layer, queries (B, heads, 1, dim; scaled), their new keys
# and values as the pool stores them) -> ``Attended``. The mirror's (``BatchMirror.attend``), or each row's own.
Reader = Callable[[int, mx.array, tuple[mx.array, ...]], Attended]


class BatchDecoder:
    """Feeds one token to each of several sequences of one pool; ``forward`` must be split (Qwen3, Qwen3-MoE) for that."""

    def __init__(self, forward: CompiledForward) -> None:
        self.forward = forward
        self.mirror: BatchMirror | None = None
        self.kept: dict[int, mx.array] = {}  # layer -> the last pass's decode rows' outputs (B, 1, hidden)
        self.each_layer = current().eval_each_layer  # the device's, as the forward's graphs are

    def __call__(self, caches: list[PagedCache], inputs: mx.array | None,
                 feeds: Sequence[PromptFeed] = (), keep: tuple[int, ...] = ()) -> mx.array | None:
        """Logits (B, V) of the next token of each sequence after ``inputs`` (B,) int32 (None for no B; lazy:
        a pick of the previous step nobody has read yet).
        ``feeds``: prompt chunks joining the batch (``prompt_feed.py``): in every layer their tokens are rows
        after the decoding ones, at their own positions, each attending causally over its own sequence; every
        layer's weights serve all the rows at once. Each chunk's ``h`` is its rows' last hidden state.
        ``keep``: layers whose outputs for the decode rows the pass keeps in ``kept``, as a chunk's ``keep``
        does for its rows (a block drafter reads them: ``drafters.py``).
        """
        if not self.forward.split:  # a model whose layers this module cannot run split (a lone reply runs it whole)
            kind = getattr(self.forward.args, "model_type", "this")
            raise ModelLoadError(f"Replies side by side run Qwen3 and Qwen3-MoE models; this is a {kind} model.")
        rows = len(caches)
        hidden: list[mx.array] = []  # each chunk's (L, 1, hidden), a row a token
        offsets: list[mx.array] = []  # and its positions
        starts, on_pool, compiled = [rows], list(caches), True  # its first row; every row's cache on the pool
        # (one loop, not five comprehensions: a lone reply's pass runs this a token)
        for feed in feeds:
            hidden.append(feed.h)
            offsets.append(feed.offsets)
            starts.append(starts[-1] + len(feed.ids))
            if feed.paged is not None:
                on_pool.append(feed.paged)
            compiled = compiled and feed.short
        compiled = compiled or rows > 0  # prompt rows alone: uncompiled
        pool = _pool(on_pool, feeds)
        reads = self._reads(pool, caches) if rows else None
        if rows:
            offsets.insert(0, mx.array([cache.offset for cache in caches], dtype=mx.int32))  # each row's position
            if inputs is not None:
                hidden.insert(0, self.forward.model.embed_tokens(inputs[:, None]))  # (B, 1, hidden): a row a sequence
        x = hidden[0] if len(hidden) == 1 else mx.concatenate(hidden)
        where = offsets[0] if len(offsets) == 1 else mx.concatenate(offsets)
        slots = slot_groups(on_pool) if pool is not None else None
        self.kept = {}
        each_layer, writes = self.each_layer, list[mx.array]()  # (the pool's writes, when the pass is one evaluation)
        runs = _runs(self.forward, pool, feeds, slots, starts) if rows == 0 and compiled else None
        for index, layer in enumerate(self.forward._layers):
            before = layer.before_batch if compiled else layer.before_rows
            q, both = before(x, where)  # (rows, heads, 1, dim) scaled; (2, kv_heads, rows, dim)
            if runs is not None and pool is not None:  # decoding replies' rows, each in one place: no helper call
                slab, at, each = runs
                storage = pool.storage[index]
                part = mx.put_along_axis(storage.slabs[slab][0], at, both, axis=2)
                storage.slabs[slab], written = (part,), [part]
            elif slots is not None and pool is not None:
                parts, written = pool.storage[index].scatter(slots, both)
            else:  # a chunk on a cache of one sequence: its layer writes it (``PromptFeed.attend``)
                written = []
            if runs is not None:
                outs = []
                for start, end, first, stop, (attention, then), mask in each:
                    keys, values = part[0:1, :, first:stop], part[1:2, :, first:stop]
                    mine = q if len(each) == 1 else q[start:end]
                    if then is None:  # the fused kernel
                        outs.append(attention(mine, keys, values))
                    else:  # the grouped products, the softmax's view between their compiled pieces
                        p, bits = attention(mine, keys, *mask)
                        outs.append(then(p * bits.view(mx.float32), values))
                x = layer.after_final(x, outs[0] if len(outs) == 1 else mx.concatenate(outs))
            elif len(feeds) == 1 and reads is None:  # one sequence's rows (a lone reply's, a prompt's): no list
                out = feeds[0].attend(q, index, both if pool is None else None)
                x = (layer.after_final if compiled else layer.after_rows)(x, out)
            elif feeds:
                outs = [feed.attend(q[start:start + len(feed.ids)], index, both if pool is None else None)
                        for feed, start in zip(feeds, starts)]
                if reads is not None:
                    decoding = tuple(part[:, :, :rows] for part in parts)
                    outs.insert(0, normalized(reads(index, q[:rows], decoding), q[:rows].shape))
                out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
                x = (layer.after_final if compiled else layer.after_rows)(x, out)
            else:
                assert reads is not None  # a pass of decode rows alone
                out, total = reads(index, q, parts)  # the attention's last division runs in the compiled half
                x = layer.after_final(x, out) if total is None else layer.after_parts(x, out, total)
            if index in keep:
                self.kept[index] = x[:rows]
            for feed, start in zip(feeds, starts):
                if index in feed.keep:
                    feed.kept[index] = x[start:start + len(feed.ids)]
            # The pool's write is evaluated with the pass: a pass reading the mirror does not depend on it, and
            # left lazy, writes would pile up. The CPU starts each layer while the next one's graph is built.
            if each_layer:
                mx.async_eval(x, written)
            else:
                writes.extend(written)
        if not each_layer:
            mx.async_eval(x, writes)
        for feed, start in zip(feeds, starts):
            feed.h = x[start:start + len(feed.ids)]
        for cache in caches:
            cache.finish_batched_pass()
        return self.forward.logits(x[:rows])[:, -1, :] if rows else None

    def _reads(self, pool: BlockPool | None, caches: list[PagedCache]) -> Reader:
        """Announce each sequence's one token; how the batch reads its keys and values this pass."""
        mirror = self._mirror(pool, caches)
        step = mirror.plan(caches) if mirror is not None else None
        for cache in caches:
            cache.begin(1)
        if mirror is not None and step is not None and mirror.live(step):  # a begin may have made the budget take the mirror back
            mirror.commit(caches, step)
            return partial(mirror.attend, step)  # the batch reads its tokens from the mirror, and writes them there too
        return _OwnReads(caches)

    def _mirror(self, pool: BlockPool | None, caches: list[PagedCache]) -> BatchMirror | None:
        """The pool's mirror of the batch, for two or more sequences (``batch_mirror.py``)."""
        if len(caches) < 2:
            return None
        assert pool is not None  # decode rows are on the pool
        if self.mirror is None or self.mirror.pool is not pool:
            self.release()
            self.mirror = BatchMirror(pool)
        return self.mirror

    def release(self) -> None:
        """Give the mirror's memory back (nothing decodes now); the next batch fills it again."""
        if self.mirror is not None:
            self.mirror.drop()


def forward_rows(forward: CompiledForward, cache: ModelCache, ids: list[int] | mx.array,
                 decoder: BatchDecoder | None = None) -> mx.array:
    """One sequence's few rows (a lone reply's decode row, a round's verification or draft pass; ``ids`` may be
    lazy) through the batched pass on ``cache``, of any kind; their logits (L, V)."""
    return forward.logits(feed_rows(forward, cache, ids, decoder).h)[:, -1]


def feed_rows(forward: CompiledForward, cache: ModelCache, ids: list[int] | mx.array,
              decoder: BatchDecoder | None = None, keep: tuple[int, ...] = ()) -> PromptFeed:
    """``forward_rows``' pass: the feed, after it ran (``keep``: the layers whose outputs it keeps)."""
    feed = PromptFeed(forward, cache, ids, decoding=True, keep=keep)
    (decoder or BatchDecoder(forward))([], None, [feed])
    feed.ran()
    return feed


def warm_up(forward: CompiledForward) -> None:
    """Build the batched pass's compiled kernels now, on throwaway caches, rather than during the first reply:
    the halves and a reply's attention on the pool (``run_attention``), and on a cache of one sequence.

    On Linux, MLX compiles them with the system C++ compiler the first time a machine sees them (tens of
    seconds), then reuses them from its disk cache.
    """
    if not forward.enabled:
        return
    paged = PagedCache(make_block_pool(forward.wrapped, max_kv=2 * sum(WARM_UP_ROWS)))
    for cache in (paged, StandardCache(model_geometry(forward.wrapped))):
        for count in sorted(WARM_UP_ROWS, reverse=True):  # (more rows first: a pass reading one key is not a run)
            mx.eval(forward_rows(forward, cache, [0] * count))
    paged.release()


def _runs(forward: CompiledForward, pool: BlockPool | None, feeds: Sequence[PromptFeed],
          slots: list[SlotGroup] | None, starts: list[int]) -> tuple | None:
    """How a pass of decoding replies' rows alone (decode rows of lone replies, verifications, a draft's;
    ``PromptFeed.short``) writes and reads each layer when it can do so in a few MLX operations, with no
    helper call: every row written to one slab of float storage, and each reply's tokens, its new ones
    included, read as one place in it (a run, or a span of runs with its gaps masked). (slab, the rows' slots
    broadcast to their keys and values, and for each reply: its first row and its end, its place's first slot
    and its end, ``run_attention``'s pieces, the grouped products' mask if any); None otherwise
    (``LayerStorage.scatter`` and ``PromptFeed.attend`` then)."""
    if pool is None or pool.geometry.format.quantized or slots is None or len(slots) != 1:
        return None
    heads, geometry, fused = forward._layers[0].heads, pool.geometry, current().fused_attention
    slab, each = slots[0][0], []
    for feed, start in zip(feeds, starts):
        n = len(feed.ids)
        if feed.paged is None or fused and n > 1:  # MLX's fused kernel reads a verification as a decode row
            return None
        reads, mask = feed.paged.read_plan(heads)  # (a span of runs in one slab is one place, its gaps masked)
        if (not isinstance(reads, list) or len(reads) != 1 or reads[0][0] != slab or mask is None
                or fused and not isinstance(mask, str)):  # (the fused kernel's own masks cannot be shapeless)
            return None
        _, first, size = reads[0]
        if size < 2:  # MLX's shapeless kernels crash on a softmax over one key (a sequence's first token)
            return None
        each.append((start, start + n, first, first + size, run_attention(fused, n, heads, geometry.kv_heads,
                     geometry.head_dim), () if fused else grouped_mask(mask, n, heads, geometry.kv_heads, size)))
    rows = starts[-1] - starts[0]
    return slab, mx.broadcast_to(slots[0][1], (2, geometry.kv_heads, rows, geometry.head_dim)), each


def _pool(on_pool: list[PagedCache], feeds: Sequence[PromptFeed]) -> BlockPool | None:
    """The one block pool every row's cache (``on_pool``: the decode rows', then the chunks') is in; None for a
    chunk on a cache of one sequence, which rides alone."""
    if feeds and feeds[0].paged is None:
        if on_pool or len(feeds) > 1:
            raise ValueError("A prompt chunk on a cache outside the block pool is read in a pass of its own.")
        return None
    pool = on_pool[0].pool
    for cache in on_pool:
        if getattr(cache, "pool", None) is not pool:
            raise ValueError("A batch's sequences must share one block pool.")
    return pool


def slot_groups(caches: Sequence[PagedCache]) -> list[SlotGroup]:
    """Where each row's key and value go (``LayerStorage.scatter``): per slab, the slots and the rows that
    write them, a row per token each cache announced (a decode row's one, a prompt chunk's), in order."""
    groups: dict[int, tuple[list[int], list[int]]] = {}  # slab -> its slots, the rows writing them
    everyone = 0
    for cache in caches:
        for slab, at in cache.write_slots():
            if slab not in groups:
                groups[slab] = [], []
            groups[slab][0].append(at)
            groups[slab][1].append(everyone)
            everyone += 1
    made: list[SlotGroup] = []  # (a loop, not a comprehension: a pass makes them for every step)
    for slab, (slots, rows) in groups.items():
        made.append((slab, mx.array(slots).reshape(1, 1, -1, 1), None if len(rows) == everyone else mx.array(rows)))
    return made


class _OwnReads:
    """Each sequence attends over views of its own blocks in the pool."""

    def __init__(self, caches: list[PagedCache]) -> None:
        self.caches = caches
        self._attention: list[Attention | None] = [None] * len(caches)  # each row's, decided at the first layer
        self._reads: list[tuple[Reads, Mask] | None] = [None] * len(caches)  # and where it reads

    def __call__(self, index: int, q: mx.array, parts: tuple[mx.array, ...]) -> Attended:
        """Attention of each sequence's query (B, heads, 1, dim; scaled) over its tokens (``attend_parts``); the
        pool holds them, the new ones (``parts``) written already."""
        outs = []
        for row, cache in enumerate(self.caches):
            query = q[row:row + 1]
            reads, mask = self._reads[row] or cache.read_plan(query.shape[1])
            segments = cache.pool.storage[index].read(reads)
            attention = self._attention[row]
            if attention is None:
                self._reads[row] = reads, mask
                attention = self._attention[row] = attention_for(query, segments, 1.0, mask, final=True)
            outs.append(attention(query, segments)[0])
        return mx.concatenate(outs, axis=0), None
