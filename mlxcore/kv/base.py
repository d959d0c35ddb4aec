"""``ModelCache``: the caches of every layer of one model, plus the token ids they hold.

The engine and the chat session hold one ``ModelCache`` per model and pass
``cache.layers`` to mlx-lm's model as ``cache=``. Each kind (standard, paged,
rotating) subclasses it; ``model_cache.py`` builds and restores them.

The token ids are told, not inferred: call ``begin(ids)`` with the ids about to
be fed, before the forward pass. ``tokens`` is then the ids of the ``offset``
tokens the layers hold; a decoder that queues a pass before it has read the ids
it feeds announces them as ``unknown`` and tells them with ``known`` once read
(until then ``tokens`` stops short of ``offset``).
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
    tokens: list[int]
    kv_format: str
    kv_bits: int | None
    group_size: int | None
    linear: LinearMeta  # a hybrid model's: its attention layers' kind is ``kind``



class ModelCache(ABC):
    """Per-layer KV caches of one model (``layers``) and the token ids they hold (``tokens``)."""

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

    @property
    def tokens(self) -> list[int]:
        """The ids of the tokens held, oldest first (a copy); those of ``unknown`` ones not told yet are not."""
        return list(self._token_ids()[:self.offset])

    def begin(self, ids: Sequence[int], unknown: int = 0) -> None:
        """Record ``ids``, then ``unknown`` tokens not read yet, as what the next forward pass feeds; call it
        before that pass. ``known`` tells the unknown ones' ids once read (a pass queued before the previous
        one is read: graph building overlaps the computation); ids are then fed again only after them.

        A ``begin`` whose forward pass never ran is dropped by the next one.
        """
        if not ids and not unknown:
            raise ValueError("begin needs at least one token.")
        self._check_layers_agree()
        self._begin(list(ids), unknown)

    def known(self, ids: Sequence[int]) -> None:
        """The ids of the oldest tokens fed as ``unknown``, in order. Keys and values are not touched."""
        if not 0 < len(ids) <= self.offset - min(len(self._token_ids()), self.offset):  # (no copy: every step)
            raise CacheStateError(f"Cannot tell {len(ids)} token ids of a cache holding {self.offset}, "
                                  f"{len(self.tokens)} of them known.")
        self._known(list(ids))

    def trim(self, n: int) -> int:
        """Remove the last ``n`` tokens from every layer and return ``n``.

        Raises ``TrimError`` and changes nothing if exactly ``n`` cannot be removed.
        """
        self._check_layers_agree()
        if not 0 <= n <= self.max_trim:
            raise TrimError(f"Cannot rewind the {self.kind} KV cache by {n} tokens: "
                            f"at most {self.max_trim} of its {self.offset} can be removed.")
        if n:
            removed = {layer.trim(n) for layer in self.layers}
            assert removed == {n}, f"layers removed {removed}, asked for {n}"
            self._after_trim()
        return n

    def settle(self) -> None:
        """Rewind the layers a forward pass stopped half way (an exception between layers) left ahead.

        Raises ``CacheStateError`` when they cannot be rewound (a wrapped rotating window).
        """
        self._check_layers_agree()

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

        Only the paged kind shares blocks; the others return 0. Never all of ``ids``.
        """
        if self.offset:
            raise CacheStateError("reuse_prefix needs an empty cache.")
        return 0

    @abstractmethod
    def fork(self) -> ModelCache:
        """A new cache holding the same tokens; later changes to either leave the other alone."""

    def release(self) -> None:
        """Give memory back to a shared pool (paged); the cache is then empty."""

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values this cache's layers use."""
        return sum(layer.nbytes for layer in self.layers)

    @abstractmethod
    def state_dict(self) -> tuple[Tensors, CacheMeta]:
        """Tensors (named ``"<layer>.<name>"``) and JSON-able metadata for a session file."""

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

    @abstractmethod
    def _token_ids(self) -> list[int]: ...

    @abstractmethod
    def _begin(self, ids: list[int], unknown: int) -> None: ...

    @abstractmethod
    def _known(self, ids: list[int]) -> None: ...

    def _after_trim(self) -> None:
        """Hook run after every layer trimmed."""

    def _check_layers_agree(self) -> None:
        """Rewind layers a forward pass that stopped half way left ahead of the others."""
        lowest = min(layer.offset for layer in self.layers)
        ahead = [layer for layer in self.layers if layer.offset > lowest]
        try:
            for layer in ahead:
                layer.trim(layer.offset - lowest)
        except TrimError:
            raise CacheStateError("KV cache layers disagree on their length after a forward pass "
                                  "stopped half way, and cannot be rewound; rebuild the cache.") from None
        if ahead:
            self._after_trim()


class RecordedTokens(ModelCache, ABC):
    """Kinds that just record the ids they are told (standard, rotating)."""

    _ids: list[int]  # the known ones

    def _token_ids(self) -> list[int]:
        return self._ids

    def _begin(self, ids: list[int], unknown: int) -> None:
        del self._ids[self.offset:]  # a begin whose forward pass never ran
        if ids and len(self._ids) < self.offset:
            raise CacheStateError("The ids of tokens fed earlier are not known yet (known() first).")
        self._ids.extend(ids)

    def _after_trim(self) -> None:
        del self._ids[self.offset:]

    def _known(self, ids: list[int]) -> None:
        self._ids.extend(ids)


def feed_one(cache: ModelCache, token: int | None) -> None:
    """``cache.begin`` for one token: ``token``, or (None) one a pass picked that nobody has read yet."""
    if token is None:
        cache.begin((), unknown=1)
    else:
        cache.begin((token,))


def layer_tensors(names: tuple[str, ...], arrays: list[tuple[mx.array, ...]]) -> Tensors:
    """Name per-layer arrays ``"<layer>.<name>"`` for a state dict."""
    return {f"{i}.{name}": array for i, group in enumerate(arrays) for name, array in zip(names, group)}


def saved_layer(tensors: Tensors, index: int, names: tuple[str, ...]) -> tuple[mx.array, ...]:
    """The arrays of layer ``index`` from a state dict; ``CacheStateError`` if one is missing."""
    try:
        return tuple(tensors[f"{index}.{name}"] for name in names)
    except KeyError as missing:
        raise CacheStateError(f"Saved KV state lacks tensor {missing.args[0]}.") from None
