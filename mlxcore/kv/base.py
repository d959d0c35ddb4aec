"""``ModelCache``: the caches of every layer of one model: keys and values, never token ids.

The engine and the chat session hold one ``ModelCache`` per model and pass
``cache.layers`` to mlx-lm's model as ``cache=``. Each kind (standard, paged,
rotating) subclasses it; ``model_cache.py`` builds and restores them.

Whoever feeds a cache owns the ids it holds (``Caches.ids``, a batched reply's
``Sequence.ids``): ``begin(count)`` announces how many tokens the next forward
pass feeds, and ``hash_blocks(ids)`` tells a paged cache the ids once they are
known and every layer holds them, so that its full blocks become prefix hits
for other sequences. A decoder may queue a pass before it has read the token it
feeds: nothing waits for the id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, TypedDict

import mlx.core as mx
import mlx.nn as nn

from mlxcore.kv.errors import CacheStateError, TrimError
from mlxcore.kv.geometry import KVGeometry
from mlxcore.kv.protocol import LayerCache

if TYPE_CHECKING:
    from mlxcore.kv.paged_pool import BlockPool

Tensors = dict[str, mx.array]


class CacheCounters(TypedDict, total=False):
    """A cache's counters, those its kind has: what a session file keeps beside its tokens and format."""

    block_size: int  # paged
    offset: int  # rotating: the ring's counters and window
    high: int
    max_size: int
    keep: int
    max_rewind: int


class LinearMeta(TypedDict):
    """A hybrid model's linear-layer states in a saved cache (hybrid.py): sets of every linear layer's state."""

    offsets: list[int]  # the tokens each kept set had read, oldest first; the last is the cache's own
    shapes: dict[str, tuple[str, list[int]]]  # "<linear layer>.<part>" -> (MLX dtype name, shape), every set alike


class CacheMeta(CacheCounters, total=False):
    """What ``state_dict`` says of a cache beside its tensors (JSON in a session file); each kind writes its own."""

    kind: str
    tokens: list[int]  # the ids the cache holds, from its owner (``state_dict(ids)``)
    kv_format: str
    kv_bits: int | None
    group_size: int | None
    linear: LinearMeta  # a hybrid model's: its attention layers' kind is ``kind``



class ModelCache(ABC):
    """Per-layer KV caches of one model (``layers``); their owner keeps the ids they hold."""

    kind: ClassVar[str]
    _kinds: ClassVar[dict[str, type[ModelCache]]] = {}

    layers: Sequence[LayerCache]
    geometry: KVGeometry  # layers, KV heads, head size, dtype of the model

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            ModelCache._kinds[cls.kind] = cls

    @property
    def offset(self) -> int:
        """Tokens held (the RoPE position of the next token)."""
        return self.layers[0].offset

    def begin(self, count: int) -> None:
        """Announce ``count`` tokens as what the next forward pass feeds; call it before that pass.
        A ``begin`` whose forward pass never ran is dropped by the next one."""
        if count < 1:
            raise ValueError("begin needs at least one token.")
        self.settle()
        self._begin(count)

    def hash_blocks(self, ids: Sequence[int]) -> None:
        """``ids``: those of the tokens this cache holds, from the first (more are ignored). Called once they are
        known and every layer holds them: a paged cache's full blocks among them become prefix hits for other
        sequences. The other kinds share nothing."""

    def trim(self, n: int) -> int:
        """Remove the last ``n`` tokens from every layer and return ``n``.
        Raises ``TrimError`` and changes nothing if exactly ``n`` cannot be removed."""
        self.settle()
        if not 0 <= n <= self.max_trim:
            raise TrimError(f"Cannot rewind the {self.kind} KV cache by {n} tokens: "
                            f"at most {self.max_trim} of its {self.offset} can be removed.")
        if n:
            removed = {layer.trim(n) for layer in self.layers}
            assert removed == {n}, f"layers removed {removed}, asked for {n}"
        return n

    def settle(self) -> None:
        """Drop what a forward pass did not commit: layers a pass stopped half way (an exception between
        layers) left ahead of the others go back to the shortest. Every pass and trim starts so.
        Raises ``CacheStateError`` when they cannot be rewound (a wrapped rotating window)."""
        lowest = min(layer.offset for layer in self.layers)
        ahead = [layer for layer in self.layers if layer.offset > lowest]
        try:
            for layer in ahead:
                layer.trim(layer.offset - lowest)
        except TrimError:
            raise CacheStateError("KV cache layers disagree on their length after a forward pass "
                                  "stopped half way, and cannot be rewound; rebuild the cache.") from None

    @property
    def keep(self) -> int:
        """Leading tokens a window never evicts; only the rotating kind evicts, the others hold everything."""
        return 0

    @keep.setter
    def keep(self, keep: int) -> None:
        """Ignored by kinds that never evict (rotating overrides it)."""

    @property
    def window_size(self) -> int | None:
        """The most tokens a window holds (rotating); None for the kinds that hold every token."""
        return None

    @property
    def max_trim(self) -> int:
        """The most tokens ``trim`` can remove now."""
        return self.offset

    def reuse_prefix(self, ids: Sequence[int]) -> int:
        """On an empty cache, attach cached blocks matching the start of ``ids``; return tokens attached.
        Only the paged kind shares blocks; the others return 0. Never all of ``ids``."""
        if self.offset:
            raise CacheStateError("reuse_prefix needs an empty cache.")
        return 0

    @abstractmethod
    def fork(self) -> ModelCache:
        """A new cache holding the same tokens; later changes to either leave the other alone."""

    def release(self, ids: Sequence[int] = ()) -> None:
        """Give memory back to a shared pool (paged); the cache is then empty. ``ids``, those of the tokens
        it held: what it held stays for prefix hits (paged: its full blocks; hybrid: all of it)."""

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values this cache's layers use."""
        return sum(layer.nbytes for layer in self.layers)

    @abstractmethod
    def state_dict(self, ids: Sequence[int]) -> tuple[Tensors, CacheMeta]:
        """Tensors (named ``"<layer>.<name>"``) and JSON-able metadata for a session file, with ``ids`` (the
        first ``offset`` of them: those of the tokens held) as its ``tokens``."""

    @classmethod
    def from_state(cls, model: nn.Module, tensors: Tensors, meta: CacheMeta,
                   pool: BlockPool | None = None) -> ModelCache:
        """Rebuild a cache saved by ``state_dict``; ``pool`` is a paged ``BlockPool`` to join."""
        kind = "hybrid" if "linear" in meta else meta.get("kind")
        if kind not in ModelCache._kinds:
            raise CacheStateError(f"Unknown KV cache kind {kind!r} in saved state.")
        return ModelCache._kinds[kind]._restore(model, tensors, meta, pool)

    # for subclasses ----------------------------------------------------------

    @classmethod
    @abstractmethod
    def _restore(cls, model: nn.Module, tensors: Tensors, meta: CacheMeta,
                 pool: BlockPool | None) -> ModelCache: ...

    def _begin(self, count: int) -> None:
        """Hook run by ``begin`` (paged: the slots the pass writes)."""

    def held_ids(self, ids: Sequence[int]) -> list[int]:
        """The ids of the tokens held, the first ``offset`` of its owner's ``ids`` (a session file's ``tokens``,
        the prefix a turn keeps): ``CacheStateError`` if ``ids`` has fewer, since nothing could be matched."""
        if len(ids) < self.offset:
            raise CacheStateError(f"A {self.kind} KV cache holding {self.offset} tokens was given {len(ids)} ids: "
                                  f"its owner gives the ids of the tokens it holds (Caches(cache, ids=...)).")
        return [int(t) for t in ids[:self.offset]]


def layer_tensors(names: tuple[str, ...], arrays: Sequence[tuple[mx.array, ...]]) -> Tensors:
    """Name per-layer arrays ``"<layer>.<name>"`` for a state dict."""
    return {f"{i}.{name}": array for i, group in enumerate(arrays) for name, array in zip(names, group)}


def saved_layer(tensors: Tensors, index: int, names: tuple[str, ...]) -> tuple[mx.array, ...]:
    """The arrays of layer ``index`` from a state dict; ``CacheStateError`` if one is missing."""
    try:
        return tuple(tensors[f"{index}.{name}"] for name in names)
    except KeyError as missing:
        raise CacheStateError(f"Saved KV state lacks tensor {missing.args[0]}.") from None
