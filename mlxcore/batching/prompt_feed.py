"""A prompt chunk that joins running streams: its tokens ride in the batch's decode passes as more rows.

A long prompt that joins running streams is read in chunks. Each chunk's tokens
go through the layers of the decode step's own forward pass as rows beside the
decoding ones (``batch_forward.py``): at their own positions, attending causally
over their own sequence, so a layer's weights are read once for every row. What
a chunk adds to a layer is a fixed part (its attention over the prompt read so
far) and a part per token, so on a device where that fixed part is dear (this
CPU) a large chunk may go through a few layers a step, its hidden state kept
until the next pass takes it on; on a GPU it goes through every layer at once.
The step's budget (token-layers) is ``pacing.py``'s. With nothing decoding, a
prompt is read the same way, the step's token budget a pass through every layer
(the rows then run uncompiled: ``_FusedLayer.before_rows``); so is a prompt on a
cache of one sequence (rotating, standard: a lone reply's, or a draft's,
``prefill()``), alone in its pass, its keys and values written by its own layers'
``update_and_fetch`` rather than the pool's scatter.

Until the last layer holds the chunk, its cache's layers keep their old length, so the blocks it
fills are not hashed (``PagedCache.hash_blocks`` covers what every layer holds): no other sequence
can find them by a prefix hit and read layers not written yet. The runner drops a sequence's chunk
wherever it lets go of its caches (the request cancelled, preempted, refused or failed); the cache's
block table is cut back there.

``Feeds`` holds the chunks in flight (several prompts may be read at once) and gives each, oldest
first, the layers the step's budget allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcore.compiled_forward import CompiledForward
from mlxcore.decode_attention import attend
from mlxcore.kv.base import ModelCache
from mlxcore.kv.paged import PagedCache

if TYPE_CHECKING:
    from mlxcore.batching.sequence import Sequence


class PromptFeed:
    """``ids`` of ``cache``'s prompt on their way through the layers: the rows a decode pass carries on."""

    def __init__(self, forward: CompiledForward, cache: ModelCache, ids: list[int], at_once: bool = False) -> None:
        """Announce the chunk to the cache (``PoolExhaustedError`` if the pool cannot take it, nothing changed);
        ``at_once``: it goes through every layer in its first step (a short prompt, ``pacing.py``; a cache of
        one sequence, always)."""
        self.paged = isinstance(cache, PagedCache)
        self.mask = None
        if not self.paged:  # its layers write as they go; the mask is the cache's (a window's, for a rotating one)
            self.mask = cache.layers[0].make_mask(len(ids), return_array=False, window_size=None)
            at_once = True
        cache.begin(len(ids))
        self.cache, self.ids, self.at_once = cache, ids, at_once
        self.layers = len(forward._layers)
        self.layer = 0  # the next layer to run
        self.stop = self.layers if at_once else 0  # the layer this step's pass stops before (``Feeds.plan``)
        self.h = forward.model.embed_tokens(mx.array(ids)[:, None])  # (L, 1, hidden): a row a token
        self.offsets = mx.arange(cache.offset, cache.offset + len(ids), dtype=mx.int32)

    @property
    def layers_left(self) -> int:
        return self.layers - self.layer

    def runs(self, index: int) -> bool:
        """Whether this step's pass takes the chunk through layer ``index``."""
        return self.layer <= index < self.stop

    def attend(self, q: mx.array, index: int, both: mx.array | None = None) -> mx.array:
        """The chunk's queries (L, heads, 1, dim; scaled) over its tokens in layer ``index``; shaped as ``q``.
        On the pool its keys and values are written already; on a cache of one sequence ``both`` (2, kv_heads,
        L, dim) are, here."""
        if self.paged:
            segments, mask = self.cache.layer_read(index, q.shape[1])
        else:
            segments, mask = [self.cache.layers[index].update_and_fetch(both[0][None], both[1][None])], self.mask
        return attend(q.transpose(2, 1, 0, 3), segments, 1.0, mask).transpose(2, 1, 0, 3)

    def ran(self) -> bool:
        """After the pass: the chunk is through ``stop``; True once through the last layer (its cache then
        holds it)."""
        self.layer = self.stop
        if self.layers_left:
            return False
        if self.paged:
            self.cache.finish_batched_pass()
        return True


class Feeds:
    """The chunks in flight, oldest first, each with the sequence whose caches it fills."""

    def __init__(self) -> None:
        self._by_sequence: dict[int, tuple[Sequence, PromptFeed]] = {}

    def add(self, seq: Sequence, feed: PromptFeed) -> None:
        self._by_sequence[id(seq)] = (seq, feed)
        seq.feeding = True  # the scheduler plans no more of its prompt meanwhile

    def drop(self, seq: Sequence) -> None:
        self._by_sequence.pop(id(seq), None)
        seq.feeding = False

    def clear(self) -> None:
        for seq, _ in list(self._by_sequence.values()):
            self.drop(seq)

    def chunks(self) -> list[PromptFeed]:
        return [feed for _, feed in self._by_sequence.values()]

    def __bool__(self) -> bool:
        return bool(self._by_sequence)

    def plan(self, work: int | None, alive: Callable[[Sequence], bool]) -> list[PromptFeed]:
        """The chunks this step's pass takes on, oldest first, each with the layers it goes through (``stop``):
        ``work`` token-layers in all (None: every chunk to its end; a chunk read at once, to its end); the
        first always goes on. Chunks whose sequence is not ``alive`` are dropped."""
        fed, running = 0, []
        for seq, feed in list(self._by_sequence.values()):
            if not alive(seq):
                self.drop(seq)
                continue
            layers = feed.layers_left if work is None or feed.at_once else \
                min(feed.layers_left, (work - fed) // len(feed.ids))
            if layers <= 0 and fed:
                continue
            layers = max(layers, 1)
            fed += layers * len(feed.ids)
            feed.stop = feed.layer + layers
            running.append(feed)
        return running

    def ran(self, feeds: list[PromptFeed]) -> tuple[int, list]:
        """After the pass that took ``feeds`` on: the token-layers fed, and the (sequence, chunk) that went
        through the last layer (no longer in flight)."""
        by_feed = {id(feed): seq for seq, feed in self._by_sequence.values()}
        fed, read = 0, []
        for feed in feeds:
            fed += (feed.stop - feed.layer) * len(feed.ids)
            if feed.ran():
                seq = by_feed[id(feed)]
                self.drop(seq)
                read.append((seq, feed))
        return fed, read
