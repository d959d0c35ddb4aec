"""Build a model's cache of any kind: ``make_model_cache(model, kind, ...)``; how one is fed: ``base.py``.

Usage, one forward pass::

    cache = make_model_cache(model, "paged")
    reused = cache.reuse_prefix(ids)          # paged: blocks other sequences already computed
    cache.begin(len(ids) - reused)             # before every forward pass
    logits = model(mx.array([ids[reused:]]), cache=cache.layers)
    cache.hash_blocks(ids)                     # paged: its full blocks become prefix hits
"""

from __future__ import annotations

import mlx.nn as nn

from mlxcore.configs import KVKind
from mlxcore.errors import UsageError
from mlxcore.kv.base import ModelCache
from mlxcore.kv.budget import KVBudget
from mlxcore.kv.geometry import model_geometry
from mlxcore.kv.hybrid import HybridCache, linear_layers
from mlxcore.kv.hybrid_prefixes import HybridPrefixCache
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.paged_pool import BlockPool, make_block_pool
from mlxcore.kv.rotating import RotatingCache
from mlxcore.kv.standard import StandardCache
from mlxcore.kv.window import Window

KINDS: tuple[str, ...] = ("standard", "paged", "rotating")
DEFAULT_WINDOW = 4096

__all__ = ["KINDS", "BlockPool", "ModelCache", "make_block_pool", "make_model_cache"]


def make_model_cache(model: nn.Module, kind: KVKind = "standard", *, block_size: int = 16,
                     max_kv: int | None = None, keep: int = 0, max_rewind: int = 16,
                     pool: BlockPool | None = None, budget: KVBudget | None = None,
                     kv_bits: int | None = None, prefixes: HybridPrefixCache | None = None) -> ModelCache:
    """An empty cache for ``model``.

    standard: mlx-lm's ``KVCache`` per layer; the other arguments are ignored.
    paged: a sequence in ``pool`` (shared between caches of one model), or in a new
      pool of ``block_size``-token blocks holding ``max_kv`` tokens, else 65,536; its slabs within
      ``budget`` (bytes shared with other pools) when one is given.
    rotating: a window of ``max_kv`` tokens (default 4,096) that keeps the first
      ``keep`` and can rewind ``max_rewind`` tokens after it wrapped.
    ``kv_bits`` (paged, rotating): keys and values quantized to this many bits (``kv_format.py``).
    A hybrid model (Qwen3.5) gets a ``HybridCache``: a cache of ``kind`` over its attention layers, standard or
    rotating for now, beside its linear layers' states; ``prefixes``: where it keeps what it held when released,
    and finds a prompt's start when empty (``hybrid_prefixes.py``)."""
    linear = linear_layers(model)
    if linear:
        check_hybrid(kind, kv_bits)
        return HybridCache(_attention_cache(model, kind, max_kv, keep, max_rewind), linear, prefixes=prefixes)
    if kind == "paged":
        if pool is None:
            pool = make_block_pool(model, block_size=block_size, max_kv=max_kv, budget=budget, kv_bits=kv_bits)
        return PagedCache(pool)
    return _attention_cache(model, kind, max_kv, keep, max_rewind, kv_bits)


def check_hybrid(kind: str, kv_bits: int | None) -> None:
    """What a hybrid model (Qwen3.5) does not run on yet, refused before any reply (docs/hybrid.md)."""
    if kind == "paged" or kv_bits is not None:
        raise UsageError('A hybrid model (Qwen3.5) runs on a float cache of kind="standard" (replies side by side) '
                         'or kind="rotating" (one at a time), for now: the paged and 8-bit caches do not hold its '
                         'linear layers\' states yet.')


def _attention_cache(model: nn.Module, kind: KVKind, max_kv: int | None, keep: int, max_rewind: int,
                     kv_bits: int | None = None) -> ModelCache:
    if kind == "standard":
        if kv_bits is not None:
            raise ValueError('The standard cache is mlx-lm\'s float one: quantized KV needs kind="paged" or '
                             'kind="rotating".')
        return StandardCache(model_geometry(model))
    if kind == "rotating":
        window = Window(max_kv or DEFAULT_WINDOW, keep, max_rewind)
        return RotatingCache(model_geometry(model, kv_bits), window)
    raise ValueError(f"Unknown KV cache kind {kind!r}; choose one of {', '.join(KINDS)}.")
