"""Chunked prefill: feed prompt tokens into a cache without computing logits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx

from mlxcore.batching.batch_forward import BatchDecoder
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.blas import parallel_products
from mlxcore.compiled_forward import CompiledForward
from mlxcore.kv.base import ModelCache
from mlxcore.kv.hybrid import HybridCache

Progress = Callable[[int, int], None]  # (prompt tokens done, prompt tokens in all)


class StopPrefill(Exception):
    """Raised by ``Engine.generate``'s Progress callback to stop before the first token; the cache keeps the
    chunks done."""


def hold(cache: ModelCache, ids: Sequence[int], forward: CompiledForward | None = None) -> None:
    """Make ``cache`` hold ``ids``: drop what a pass did not commit (``settle``), trim what is ahead of them
    and, with ``forward``, feed what it lacks of them. Without, a cache behind ``ids`` stays a prefix of them
    (an interrupted prefill keeps the chunks every layer completed). Its full blocks are then hashed."""
    cache.settle()  # first: a pass stopped between layers leaves layer 0 ahead of the rest
    ahead = cache.offset - len(ids)
    if ahead > 0 and isinstance(cache, HybridCache):  # it cannot be trimmed: back to before the pass
        cache.rewind_to_mark()
    elif ahead > 0:
        cache.trim(ahead)
    missing = list(ids[cache.offset:])
    if forward is not None and missing:
        prefill(forward, cache, missing, len(missing))
    cache.hash_blocks(ids)


def prefill(forward: CompiledForward, cache: ModelCache, ids: Sequence[int], chunk: int) -> None:
    """Feed ``ids`` into ``cache`` in chunks of ``chunk`` tokens, on every BLAS thread, computing no logits.

    Each chunk is a pass of the batched forward's prompt rows alone (``PromptFeed``, ``BatchDecoder``), as the
    runner reads any prompt: one way to read a prompt, whatever the cache. A model whose layers are not run
    split here (a hybrid one) runs its own layers (its inner model: no logits).
    """
    if not ids:
        return
    decoder = BatchDecoder(forward) if forward.split else None
    with parallel_products():
        for done in range(0, len(ids), chunk):
            piece = list(ids[done : done + chunk])
            if decoder is not None:
                feed = PromptFeed(forward, cache, piece)
                decoder([], None, [feed])
                mx.eval(feed.h)  # the last layer's rows hold every layer's writes
                feed.ran()
            else:
                cache.begin(len(piece))
                mx.eval(forward.model(mx.array(piece)[None], cache=cache.layers))  # materialises every layer's cache
