"""A prompt chunk read as rows of the batched pass: through every layer in the pass that takes it.

A prompt is read in chunks under the step's token budget (``scheduler.py``: decode rows count one token
each, a chunk its tokens; the budget is the device profile's ``step_tokens``). Each chunk's tokens go
through every layer of the step's own forward pass as rows beside the decoding ones
(``batch_forward.py``): at their own positions, attending causally over their own sequence, so a
layer's weights are read once for every row. With nothing decoding, the chunk is a pass of prompt rows
alone (uncompiled: ``_FusedLayer.before_rows``); so is a prompt on a cache of one sequence (rotating,
standard: a lone reply's, or a draft's, ``prefill()``), its keys and values written by its own layers'
``update_and_fetch`` rather than the pool's scatter.

The budget trades a joining prompt's first token against the running streams' gaps: a step that carries
a chunk takes as long as the chunk's rows do (docs/device-profile.md).
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.compiled_forward import MAX_COMPILED_TOKENS, CompiledForward
from mlxcore.decode_attention import Attention, attention_for
from mlxcore.kv.base import ModelCache
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.protocol import Mask
from mlxcore.kv.slab_storage import Reads


class PromptFeed:
    """``ids`` of ``cache``'s prompt going through the layers: the rows a pass carries beside its decode rows.
    A speculative round's verification is such rows too: the reply's last token and its draft's proposals
    (``ids`` an array, lazy), whose every row's hidden state is kept (``spec_rows.py``)."""

    def __init__(self, forward: CompiledForward, cache: ModelCache, ids: list[int] | mx.array,
                 decoding: bool = False, keep: tuple[int, ...] = ()) -> None:
        """Announce the chunk to the cache (``PoolExhaustedError`` if the pool cannot take it, nothing changed).
        ``decoding``: a decoding reply's few rows (a lone decode row, a speculative round's: ``forward_rows``).
        ``keep``: layers whose outputs for these rows the pass keeps in ``kept`` (a block drafter reads them:
        ``drafters.py``)."""
        # A pass of such rows alone runs compiled, as decode rows do (their counts repeat); a prompt's chunk
        # lengths vary, and each new one would trace a graph anew.
        self.short = decoding and len(ids) <= MAX_COMPILED_TOKENS
        self.paged = cache if isinstance(cache, PagedCache) else None  # on the pool: the pass writes its slots
        self.mask: Mask = None
        if self.paged is None:  # its layers write as they go; the mask is the cache's (a window's, for a rotating one)
            self.mask = cache.layers[0].make_mask(len(ids), return_array=False, window_size=None)
        cache.begin(len(ids))
        self.cache, self.ids = cache, ids
        self.start = cache.offset  # the position of its first token
        self.keep, self.kept = keep, dict[int, mx.array]()  # layer -> its output (L, 1, hidden), once the pass ran
        self.h = forward.model.embed_tokens((ids if isinstance(ids, mx.array) else mx.array(ids))[:, None])  # (L, 1, hidden): a row a token
        self.offsets = mx.arange(cache.offset, cache.offset + len(ids), dtype=mx.int32)
        self._attention: Attention | None = None
        self._reads: tuple[Reads, Mask] | None = None  # on the pool: this pass's (``PagedCache.read_plan``)

    def attend(self, q: mx.array, index: int, both: mx.array | None = None) -> mx.array:
        """The chunk's queries (L, heads, 1, dim; scaled) over its tokens in layer ``index``; shaped as ``q``.
        On the pool its keys and values are written already; on a cache of one sequence ``both`` (2, kv_heads,
        L, dim) are, here."""
        if self.paged is not None:
            if self._reads is None:  # where it reads is found once a pass: every layer reads alike
                self._reads = self.paged.read_plan(q.shape[1])
            reads, mask = self._reads
            segments = self.paged.pool.storage[index].read(reads)
        else:
            assert both is not None  # a cache of one sequence is given its keys and values
            segments, mask = [self.cache.layers[index].update_and_fetch(both[0][None], both[1][None])], self.mask
        q = q.transpose(2, 1, 0, 3)
        if self._attention is None:  # decided at the first layer: every layer reads alike
            self._attention = attention_for(q, segments, 1.0, mask, final=True)
        return self._attention(q, segments)[0].transpose(2, 1, 0, 3)

    def ran(self) -> None:
        """After the pass: its cache holds the chunk in every layer."""
        if self.paged is not None:
            self.paged.finish_batched_pass()
