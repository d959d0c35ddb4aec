"""Bench rows for the KV caches; each returns a plain dict with ``key``, ``value`` (a ratio) and the raw figures.

Memory rows feed synthetic keys/values of the model's geometry straight into
the layer caches (the bytes do not depend on the values, and no forward pass
is needed); the speed row runs the model.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcore.kv.base import ModelCache
from mlxcore.kv.model_cache import make_block_pool, make_model_cache

Row = dict[str, Any]


def paged_kv_overhead(model: nn.Module, tokens: int = 1000, block_size: int = 16) -> Row:
    """Paged cache bytes / bytes of the tokens it holds (bound: 1 + block_size / tokens).

    Cache bytes are those of the sequence's blocks; ``allocated_ratio`` adds the
    storage the pool took ahead (it grows in chunks of blocks).
    """
    pool = make_block_pool(model, block_size=block_size)
    cache = make_model_cache(model, "paged", pool=pool)
    fill(cache, list(range(tokens)))
    held = tokens * pool.geometry.token_bytes
    return {"key": "paged_kv_overhead", "value": cache.nbytes / held, "bound": 1 + block_size / tokens,
            "tokens": tokens, "block_size": block_size, "cache_bytes": cache.nbytes, "held_bytes": held,
            "allocated_ratio": pool.bytes_allocated / held}


def branch_memory(model: nn.Module, prefix: int = 1000, suffix: int = 50, branches: int = 8,
                  block_size: int = 16) -> Row:
    """Bytes for ``branches`` branches of one ``prefix``-token history, each ``suffix`` tokens longer.

    Paged: the pool's blocks in use (shared blocks once). Standard: the N
    ``KVCache`` forks' own buffers. ``bound`` is prefix + N x (suffix + one block).
    """
    pool = make_block_pool(model, block_size=block_size)
    paged_root, standard_root = make_model_cache(model, "paged", pool=pool), make_model_cache(model, "standard")
    history = list(range(prefix))
    for root in (paged_root, standard_root):
        fill(root, history)
    paged, standard = [], []
    for branch in range(branches):
        own = [prefix + branch * suffix + i for i in range(suffix)]
        paged.append(paged_root.fork())
        standard.append(standard_root.fork())
        fill(paged[-1], own)
        fill(standard[-1], own)
    paged_root.release()  # only the branches count
    token_bytes = pool.geometry.token_bytes
    standard_bytes = sum(cache.nbytes for cache in standard)
    paged_bytes = pool.stats().used_blocks * pool.block_bytes  # the blocks the branches hold, shared ones once
    return {"key": "paged_branch_bytes_vs_standard", "value": paged_bytes / standard_bytes,
            "branches": branches, "prefix": prefix, "suffix": suffix, "paged_bytes": paged_bytes,
            "standard_bytes": standard_bytes, "bound_bytes": (prefix + branches * (suffix + block_size)) * token_bytes}


def decode_speed(model: nn.Module, kind: str, prompt_tokens: int = 512, steps: int = 64, **options: Any) -> float:
    """Greedy decode tokens per second on a cache of ``kind`` after a ``prompt_tokens`` prefill."""
    cache = make_model_cache(model, kind, **options)
    ids = [i % model.args.vocab_size for i in range(prompt_tokens)]
    cache.begin(len(ids))
    token = int(mx.argmax(model(mx.array([ids]), cache=cache.layers)[0, -1]).item())
    start = time.perf_counter()
    for _ in range(steps):
        cache.begin(1)
        token = int(mx.argmax(model(mx.array([[token]]), cache=cache.layers)[0, -1]).item())
    return steps / (time.perf_counter() - start)


def paged_decode_vs_standard(model: nn.Module, prompt_tokens: int = 512, steps: int = 64, rounds: int = 3) -> Row:
    """Decode tok/s on ``paged`` / on ``standard``, best of ``rounds`` each (interleaved)."""
    best = {"paged": 0.0, "standard": 0.0}
    for _ in range(rounds):
        for kind in best:
            best[kind] = max(best[kind], decode_speed(model, kind, prompt_tokens, steps))
    return {"key": "paged_decode_vs_standard", "value": best["paged"] / best["standard"],
            "paged_tok_s": best["paged"], "standard_tok_s": best["standard"], "prompt_tokens": prompt_tokens}


def fill(cache: ModelCache, ids: list[int], chunk: int = 512) -> None:
    """Append ``ids`` with zero keys/values of the model's geometry, without a forward pass."""
    g = cache.geometry
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        zeros = mx.zeros((1, g.kv_heads, len(part), g.head_dim), g.dtype)
        cache.begin(len(part))
        mx.eval([layer.update_and_fetch(zeros, zeros) for layer in cache.layers])
