"""A prompt chunk fed through the model's layers a few at a time, between the batch's decode passes.

A long prompt that joins running streams is read in chunks. What a chunk adds to a step is, for
every layer it goes through, a fixed part (its attention over the prompt read so far, a dozen MLX
operations) and a part per token. Fed through all layers in one step, a chunk pays every layer's
fixed part in that step; fed through one layer a step, a chunk several times larger adds about as
much to each step, so the prompt advances faster for the same stall of the running streams.
``pacing.py`` chooses the chunk's tokens and the layers a step goes through.

Until the last layer holds the chunk, its cache's layers keep their old length and the blocks it
fills are not hashed, so no other sequence can find them by a prefix hit and read layers not
written yet. A cache released or settled meanwhile (the request was cancelled or preempted) makes
the feed ``stale``: it is dropped, and the cache's block table was already cut back.

``Feeds`` holds the chunks in flight (several prompts may be read at once) and runs them, oldest
first, through as many layers as the step's pace allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcore.batching.batch_forward import SlotWrites
from mlxcore.compiled_forward import CompiledForward
from mlxcore.decode_attention import attend
from mlxcore.kv.paged import PagedCache

if TYPE_CHECKING:
    from mlxcore.batching.sequence import Sequence


class PromptFeed:
    """``ids`` of ``cache``'s prompt on their way through the layers; ``advance`` runs the next few."""

    def __init__(self, forward: CompiledForward, cache: PagedCache, ids: list[int], at_once: bool = False) -> None:
        """Announce the chunk to the cache (``PoolExhaustedError`` if the pool cannot take it, nothing changed);
        ``at_once``: it goes through every layer in its first step (a short prompt, ``pacing.py``)."""
        cache.begin_unhashed(ids)
        self.forward, self.cache, self.ids, self.at_once = forward, cache, ids, at_once
        self.plan = cache.announced
        self.layer = 0  # the next layer to run
        self.h = forward.model.embed_tokens(mx.array(ids)[:, None])  # (L, 1, hidden): a row a token
        self.offsets = mx.arange(cache.offset, cache.offset + len(ids), dtype=mx.int32)
        keys = cache.offset + len(ids)  # query i sees keys up to its own position
        self.causal = mx.arange(keys)[None] <= mx.arange(len(ids))[:, None] + cache.offset
        self.writes = SlotWrites([], cache)

    @property
    def stale(self) -> bool:
        """Whether the cache let go of the chunk (released, or settled by another pass)."""
        return self.cache.announced is not self.plan

    @property
    def layers_left(self) -> int:
        return len(self.forward._layers) - self.layer

    def advance(self, layers: int) -> bool:
        """Run the next ``layers`` layers (queued, not waited for); True once the chunk went through the last."""
        end = min(self.layer + layers, len(self.forward._layers))
        for index in range(self.layer, end):
            layer, storage = self.forward._layers[index], self.cache.pool.storage[index]
            q, both = layer.before_batch(self.h, self.offsets)  # (L, heads, 1, dim) scaled; (2, kv_heads, L, dim)
            written = self.writes.apply(storage, both)
            segments, seen = self.cache.layer_read(index)
            out = attend(q.transpose(2, 1, 0, 3), segments, 1.0, self.causal if seen is None else seen)
            self.h = layer.after(self.h, (out.transpose(2, 1, 0, 3), None))
            mx.async_eval(self.h, written)
        self.layer = end
        if self.layers_left:
            return False
        self.cache.finish_batched_pass()  # every layer holds the chunk: its length and hashes are real now
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

    def advance(self, work: int | None, alive: Callable[[Sequence], bool]) -> tuple[int, list]:
        """Run the chunks through more layers, oldest first, ``work`` token-layers in all (None: to the end;
        a chunk read at once, to its end); the first always goes on. Chunks whose caches were let go (or
        whose sequence is not ``alive``) are dropped. Returns the token-layers fed and the (sequence, chunk)
        that went through the last layer."""
        fed, read = 0, []
        for seq, feed in list(self._by_sequence.values()):
            if feed.stale or not alive(seq):
                self.drop(seq)
                continue
            layers = feed.layers_left if work is None or feed.at_once else \
                min(feed.layers_left, (work - fed) // len(feed.ids))
            if layers <= 0 and fed:
                continue
            layers = max(layers, 1)
            fed += layers * len(feed.ids)
            if feed.advance(layers):
                self.drop(seq)
                read.append((seq, feed))
        return fed, read
