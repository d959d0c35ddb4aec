"""Chunked prefill: feed prompt tokens into a cache without computing logits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx

from mlxcore.blas import parallel_products
from mlxcore.compiled_forward import CompiledForward
from mlxcore.kv.hybrid import HybridCache

Progress = Callable[[int, int], None]  # (prompt tokens done, prompt tokens in all)


class StopPrefill(Exception):
    """Raised by a Progress callback to stop before the first token; the cache keeps the chunks done."""


def settle(cache, ids: Sequence[int], forward: CompiledForward | None = None) -> None:
    """Make ``cache`` hold ``ids``: even out a pass stopped between layers, trim what is ahead of them and,
    with ``forward``, feed what it lacks of them. Without, a cache behind ``ids`` stays a prefix of them
    (an interrupted prefill keeps the chunks every layer completed)."""
    cache.settle()  # first: a pass stopped between layers leaves layer 0 ahead of the rest
    ahead = cache.offset - len(ids)
    if ahead > 0 and isinstance(cache, HybridCache):  # it cannot be trimmed: back to before the pass
        cache.rewind_to_mark()
    elif ahead > 0:
        cache.trim(ahead)
    told = len(cache.tokens)
    if told < cache.offset:  # a pass fed tokens whose ids were read but not told yet
        cache.known(ids[told:cache.offset])
    missing = list(ids[cache.offset:])
    if forward is not None and missing:
        prefill(forward, cache, missing, len(missing))


def prefill(forward: CompiledForward, cache, ids: Sequence[int], chunk: int, progress: Progress | None = None) -> None:
    """Feed ``ids`` into ``cache`` in chunks of ``chunk`` tokens.

    Runs the layers only (``CompiledForward.body``: uncompiled, with the device's
    attention and SiLU), so no vocabulary-sized logits are computed for tokens whose
    prediction nobody reads.
    ``progress`` is called with 0 done before the first chunk and after every chunk;
    it may raise ``StopPrefill`` to stop between chunks.
    """
    if not ids:
        return
    done = 0
    with parallel_products():
        if progress is not None:
            progress(0, len(ids))
        while done < len(ids):
            piece = list(ids[done : done + chunk])
            cache.begin(piece)
            hidden = forward.body(mx.array(piece)[None], cache.layers)  # (1, n, hidden)
            mx.eval(hidden)  # evaluating the last layer's output materialises every layer's cache
            done += len(piece)
            if progress is not None:
                progress(done, len(ids))
