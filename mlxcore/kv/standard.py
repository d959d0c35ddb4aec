"""The ``standard`` kind: mlx-lm's own ``KVCache`` per layer, the reference the others match."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from mlxcore.kv.base import CacheMeta, ModelCache, Tensors, layer_tensors, saved_layer
from mlxcore.kv.errors import CacheStateError
from mlxcore.kv.geometry import KVGeometry, model_geometry

if TYPE_CHECKING:
    from mlxcore.kv.paged_pool import BlockPool

_NAMES = ("keys", "values")


class StandardLayerCache(KVCache):
    """mlx-lm's ``KVCache`` unchanged, plus the ``meta_state`` the protocol lists (mlx-lm 0.32 dropped it)."""

    @property
    def meta_state(self) -> tuple[str, ...]:
        return ("standard", str(self.offset))


class StandardCache(ModelCache):
    """One mlx-lm ``KVCache`` per layer; fork copies, ``reuse_prefix`` finds nothing."""

    kind = "standard"

    def __init__(self, geometry: KVGeometry) -> None:
        self.geometry = geometry
        self.layers: list[StandardLayerCache] = [StandardLayerCache() for _ in range(geometry.num_layers)]

    def fork(self) -> StandardCache:
        child = StandardCache(self.geometry)
        for mine, theirs in zip(self.layers, child.layers):
            if mine.keys is not None:
                # A slice is a new array: writes to either cache never reach the other.
                theirs.state = (mine.keys[..., :mine.offset, :], mine.values[..., :mine.offset, :], mine.offset)
        return child

    def state_dict(self, ids: Sequence[int]) -> tuple[Tensors, CacheMeta]:
        self.settle()  # every layer the same length, matching the ids
        arrays = [(c.keys[..., :c.offset, :], c.values[..., :c.offset, :]) for c in self.layers if c.offset]
        return layer_tensors(_NAMES, arrays), {"kind": self.kind, "tokens": self.held_ids(ids)}

    @classmethod
    def _restore(cls, model: nn.Module, tensors: Tensors, meta: CacheMeta, pool: BlockPool | None) -> StandardCache:
        geometry = model_geometry(model)
        cache, count = cls(geometry), len(meta.get("tokens", []))
        if count:
            for index, layer in enumerate(cache.layers):
                keys, values = saved_layer(tensors, index, _NAMES)
                geometry.check(keys, values, "saved standard KV state")
                if keys.shape[2] != count:
                    raise CacheStateError("Saved standard KV state: tensor length and token count differ.")
                layer.state = (keys, values, keys.shape[2])
        return cache
