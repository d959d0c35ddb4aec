"""Rows `paged_decode_vs_standard_long` and `paged_decode_vs_standard_twin`: decode at a long context, paged / standard.

One prefill (a real forward pass) makes the context; every run then starts
from copies of it, restored from its saved state as a session file would be,
and decodes greedily through ``Engine.generate`` (the path ``ChatSession``
takes), so only the cache kind differs:

- fresh: the paged table in a new pool (its blocks adjacent), against a standard cache;
- forked: a fork of such a table, whose parent holds the shared blocks meanwhile
  (the child's blocks are not adjacent), against a fork of a standard cache.

The two streams of a case decode in turns, a chunk of tokens each (the order
alternating, the queue drained between chunks), so a slow spell of a shared
machine falls on both; the value is the median of the per-chunk-pair ratios.
"""
from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator

import mlx.core as mx

from mlxcore.device_profile import current
from bench.timing import stream_rate
from mlxcore.caches import Caches
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.kv.base import ModelCache
from mlxcore.kv.model_cache import make_block_pool, make_model_cache
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from mlxcore.prefill import prefill
from bench.twins import twin_folder

TWIN = "qwen3-8b"
KINDS = ("paged", "standard")


def paged_decode_vs_standard_long(model_ref: str, runs: int, context: int = 3000) -> dict:
    """The embedded target at a 3,000-token context."""
    return dict(paged_decode_vs_standard(model_ref, runs, context, chunks=6, chunk=16), model=model_ref)


def paged_decode_vs_standard_twin(runs: int, context: int = 2000) -> dict:
    """The 8B twin (36 layers x 8 KV heads x 128, float32) at a 2,000-token context."""
    folder = twin_folder(TWIN, bits=None)
    return dict(paged_decode_vs_standard(str(folder), runs, context, chunks=6, chunk=4),
                model=f"{TWIN} twin, float32")


def paged_decode_vs_standard(model_ref: str, runs: int, context: int, *, chunks: int, chunk: int) -> dict:
    """Decode tok/s paged / standard on fresh and forked tables (see the module docstring)."""
    loaded = load_model(model_ref)
    model = loaded.model
    engine = Engine(model, loaded.tokenizer, kv=KVConfig(kind="paged"))
    engine.warm_up()
    engine.eos_ids = set()  # no reply ends early
    ids = [(index * 7919) % (model.args.vocab_size - 1) + 1 for index in range(context + 1)]
    root = make_model_cache(model, "standard")
    prefill(engine.target_forward, root, ids[:context], current().prefill_chunk)
    tensors, meta = root.state_dict(ids)
    del root
    held: list[ModelCache] = []  # forked tables' parents, alive while their child decodes

    def restored(kind: str) -> ModelCache:
        pool = make_block_pool(model) if kind == "paged" else None
        return ModelCache.from_state(model, tensors, dict(meta, kind=kind), pool=pool)

    def forked(kind: str) -> ModelCache:
        held.append(restored(kind))
        child = held[-1].fork()
        held[-1].begin(len(ids) - context)  # the parent goes on first: it takes the block after the shared ones
        mx.eval(model(mx.array([ids[context:]]), cache=held[-1].layers))
        return child

    cases = {"fresh": restored, "forked": forked}
    ratios: dict[str, list[float]] = {case: [] for case in cases}
    rates: dict[str, list[float]] = {f"{case}_{kind}": [] for case in cases for kind in KINDS}
    block_runs = 0
    for run in range(runs + 1):  # the first run warms both paths up and is not counted
        for case, make in cases.items():
            caches = {kind: make(kind) for kind in KINDS}
            params = GenerationParams(max_tokens=chunks * (chunk + 1))
            streams = {kind: engine.generate(ids, Caches(cache, ids=ids[:cache.offset]), params)
                       for kind, cache in caches.items()}
            chunk_rates = in_turns(streams, chunks, chunk)
            if run:
                ratios[case] += [p / s for p, s in zip(chunk_rates["paged"], chunk_rates["standard"])]
                for kind in KINDS:
                    rates[f"{case}_{kind}"] += chunk_rates[kind]
            if case == "forked":
                block_runs = len(caches["paged"]._gather_index().runs)  # of the paged child's table
            for kind, cache in caches.items():
                streams[kind].close()
                cache.release()
            held.clear()
    return {"value": statistics.median(ratios["fresh"]), "forked": statistics.median(ratios["forked"]),
            "ratios": ratios["fresh"], "forked_ratios": ratios["forked"],
            **{f"{name}_tps": statistics.median(values) for name, values in rates.items()},
            "forked_block_runs": block_runs,
            "context": context, "tokens": runs * chunks * chunk}


def in_turns(streams: dict[str, Iterator], chunks: int, chunk: int) -> dict[str, list[float]]:
    """Decode tok/s of each stream over ``chunks`` chunks of ``chunk`` tokens, the streams taking turns."""
    rates: dict[str, list[float]] = {name: [] for name in streams}
    for index in range(chunks):
        for name in list(streams) if index % 2 == 0 else list(streams)[::-1]:
            mx.synchronize()  # the other stream's queued step is not this one's time
            tokens = (event for event in streams[name] if isinstance(event, TokenEvent))
            rates[name].append(stream_rate(itertools.islice(tokens, chunk + 1))[0])
    return rates
