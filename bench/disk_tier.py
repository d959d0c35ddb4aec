"""Bench rows of the KV disk tier (issue 61), paired in one run on the embedded target (no draft).

``restart_ttft_vs_cold``: the first token of a conversation of ``tokens`` tokens plus a new message, on an engine
whose pool is empty (as after a restart: ``release_kv`` sends every block to disk first) with the disk tier, /
the same on an engine without one (it computes the whole prompt). ``disk_tier_decode_cost``: decode tok/s while
the pool evicts a cached prefix every block (each block written to disk, in the background) / the same with the
tier off, on one engine (the same layout of blocks in memory).
"""

from __future__ import annotations

import tempfile
import time
from itertools import count
from pathlib import Path

from bench.timing import paired_median
from mlxcore.configs import KVConfig
from mlxcore.engine import Engine
from mlxcore.kv.disk_tier import drain_disk_tiers
from mlxcore.kv.pool_disk import PoolDisk
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams


def _ids(count: int, seed: int) -> list[int]:
    return [(i * 7919 + seed * 104729) % 1000 + 10 for i in range(count)]


def _engine(target: str, folder: Path | None, **kv: int) -> Engine:
    disk = {"disk_kv_bytes": 1 << 32, "disk_kv_dir": str(folder)} if folder is not None else {}
    return open_engine(ModelChoice(model=target, no_draft=True), KVConfig(**disk, **kv)).engine


def _first_token_seconds(engine: Engine, ids: list[int]) -> float:
    engine.release_kv()  # the pool empty, as after a restart (its blocks to disk, with a tier)
    drain_disk_tiers()
    caches = engine.new_caches()
    start = time.perf_counter()
    for _ in engine.generate(ids, caches, GenerationParams(temperature=0, max_tokens=1)):
        break
    seconds = time.perf_counter() - start
    caches.target.release(caches.ids)
    return seconds


def restart_ttft_vs_cold(target: str, runs: int, *, tokens: int = 3000) -> dict:
    conversation, turn = _ids(tokens, 0), _ids(24, 1)
    with tempfile.TemporaryDirectory() as folder:
        warm, cold = _engine(target, Path(folder)), _engine(target, None)
        _first_token_seconds(warm, conversation)  # the conversation so far: its blocks go to disk
        prompt = conversation + turn
        result = paired_median(lambda: _first_token_seconds(warm, prompt), lambda: _first_token_seconds(cold, prompt),
                               runs)
        disk_hits = warm.pool("target").disk.hit_tokens  # type: ignore[union-attr]
    return {"value": result["ratio"], **result, "prompt_tokens": len(prompt), "disk_hit_tokens": disk_hits}


def _decode_tps(engine: Engine, disk: PoolDisk | None, cached: list[int], prompt: list[int], tokens: int) -> float:
    """Decode tok/s of ``prompt`` on a pool that holds ``cached`` as a cached prefix it must evict as it grows,
    with the tier ``disk`` under the pool (None: none)."""
    pool = engine.pool("target")
    for ids in (cached, prompt):
        caches = engine.new_caches()  # (which attaches the engine's tier again)
        pool.disk, pool.manager.leaving = disk, ([] if disk is not None else None)
        events = list(engine.generate(ids, caches, GenerationParams(temperature=0, max_tokens=tokens)))
        caches.target.release(caches.ids)
    assert events and engine.last_stats is not None
    return engine.last_stats.decode_tps


def disk_tier_decode_cost(target: str, runs: int, *, tokens: int = 256) -> dict:
    """One engine, the tier on and off by turns; every run's cached prefix is new (so it is computed, its
    blocks lie as in the other runs, and its eviction writes new blocks)."""
    capacity = 1024  # tokens the pool holds: the cached prefix fills most of it, the reply evicts it
    prompt, seeds = _ids(32, 3), count(10)
    with tempfile.TemporaryDirectory() as folder:
        engine = _engine(target, Path(folder), max_kv=capacity)
        disk = engine.pool("target").disk
        result = paired_median(lambda: _decode_tps(engine, disk, _ids(capacity - 64, next(seeds)), prompt, tokens),
                               lambda: _decode_tps(engine, None, _ids(capacity - 64, next(seeds)), prompt, tokens),
                               runs)
        drain_disk_tiers()
        written = disk.tier.written if disk is not None else 0
    return {"value": result["ratio"], **result, "decode_tokens": tokens, "blocks_written": written}
