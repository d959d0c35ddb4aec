"""Rows of the 8-bit KV cache against the float one, on the same model and tokens.

- ``kv8_bytes_ratio`` / ``kv4_bytes_ratio``: bytes a token's keys and values take, quantized / float
  (the pool's own account; 4 bits is measured the same way though mlxchat does not offer it).
- ``kv8_decode_vs_float_long``: decode tok/s at a 3,000-token context, 8-bit / float, both paged,
  the two streams taking turns chunk by chunk (``paged_decode.in_turns``).
- ``kv8_prefill_peak_vs_float``: MLX's peak memory while prefilling 2,000 tokens, 8-bit / float
  (model weights excluded: measured from the memory in use before the prefill).
- ``kv8_accuracy`` (and ``kv4_accuracy``): the next-token distributions of the quantized cache
  against the float one's, both read the same 1,000-token prompt (README.md in the model's tokens),
  then fed 1,000 tokens one at a time as decoding feeds them, twice: the text's next 1,000 tokens
  (a 2,000-token context of real text), and the 1,000 the float cache generates greedily. Mean
  KL(float || quantized) of each (the value is the larger), and the greedy agreement: the share of
  generated positions where the quantized cache, fed the same tokens, picks the same one.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
from pathlib import Path

import mlx.core as mx

from mlxcore.device_profile import current
from bench.paged_decode import in_turns
from mlxcore.batching.batch_forward import forward_rows
from mlxcore.compiled_forward import CompiledForward
from mlxcore.engine import Engine, KVConfig
from mlxcore.kv.geometry import model_geometry
from mlxcore.kv.kv_format import KVFormat, kv_format
from mlxcore.kv.model_cache import make_model_cache
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.paged_pool import BlockPool, PoolConfig
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from mlxcore.prefill import prefill

TEXT = Path(__file__).resolve().parents[1] / "README.md"


def bytes_ratio(model_ref: str, bits: int) -> dict:
    """Stored bytes per token, ``bits`` / float, from the geometry the pool charges its budget with."""
    model = load_model(model_ref).model
    float_geometry = model_geometry(model)
    quantized = dataclasses.replace(float_geometry, format=_format(bits, float_geometry.head_dim))
    return {"value": quantized.token_bytes / float_geometry.token_bytes, "token_bytes": quantized.token_bytes,
            "float_token_bytes": float_geometry.token_bytes, "format": quantized.format.name,
            "offered": bits == 8}


def decode_vs_float_long(model_ref: str, runs: int, context: int = 3000, chunks: int = 6, chunk: int = 16) -> dict:
    loaded = load_model(model_ref)
    model = loaded.model
    engines = {name: Engine(model, loaded.tokenizer, kv=KVConfig(kind="paged", kv_bits=bits))
               for name, bits in (("kv8", 8), ("float", None))}
    for engine in engines.values():
        engine.eos_ids = set()  # no reply ends before its chunks (at a short context the model may end at once)
    ids = _tokens(loaded.tokenizer, context + 1)
    ratios = []
    for run in range(runs + 1):  # the first run warms both up
        caches = {name: engine.new_caches() for name, engine in engines.items()}
        for name, cache in caches.items():
            prefill(engines[name].target_forward, cache.target, ids[:context], current().prefill_chunk)
            cache.ids = ids[:context]  # what it holds: the turn below reads only the last token
        streams = {name: engines[name].generate(ids, cache, GenerationParams(max_tokens=chunks * (chunk + 1)))
                   for name, cache in caches.items()}
        rates = in_turns(streams, chunks, chunk)
        if run:
            ratios += [q / f for q, f in zip(rates["kv8"], rates["float"])]
        for name in caches:
            streams[name].close()
            caches[name].release()
    return {"value": statistics.median(ratios), "ratios": ratios, "context": context}


def prefill_peak_vs_float(model_ref: str, tokens: int = 2000, runs: int = 2) -> dict:
    """Each prefill in a process of its own (one process's allocator keeps what earlier runs freed)."""
    peaks = {"kv8": [], "float": []}
    for _ in range(runs):
        for name, bits in (("float", None), ("kv8", 8)):
            peaks[name].append(_peak_in_child(model_ref, bits, tokens))
    kv8, float_peak = min(peaks["kv8"]), min(peaks["float"])
    return {"value": kv8 / float_peak, "kv8_peak_bytes": kv8, "float_peak_bytes": float_peak, "tokens": tokens}


def _peak_in_child(model_ref: str, bits: int | None, tokens: int) -> int:
    code = ("import mlxcore, sys; from bench.kv_quant import prefill_peak; "
            f"print(prefill_peak({model_ref!r}, {bits!r}, {tokens}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    return int(run.stdout.strip().splitlines()[-1])


def prefill_peak(model_ref: str, bits: int | None, tokens: int) -> int:
    """MLX's peak memory above what the loaded model holds, prefilling ``tokens`` into a new paged cache."""
    loaded = load_model(model_ref)
    ids = _tokens(loaded.tokenizer, tokens)
    forward = CompiledForward(loaded.model)  # before the base: its fused weights are not the prefill's
    mx.synchronize()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    cache = make_model_cache(loaded.model, "paged", kv_bits=bits)
    prefill(forward, cache, ids, current().prefill_chunk)
    mx.synchronize()
    return mx.get_peak_memory() - base


def accuracy(model_ref: str, bits: int, prompt: int = 1000, decode: int = 1000) -> dict:
    """See the module docstring: the value is the larger of the two mean KL divergences."""
    loaded = load_model(model_ref)
    text = _tokens(loaded.tokenizer, prompt + decode)
    fed = _compare(loaded.model, bits, text[:prompt], decode, follow=text[prompt:])
    generated = _compare(loaded.model, bits, text[:prompt], decode)
    return {"value": max(fed["kl_mean"], generated["kl_mean"]), "greedy_agreement": generated["agreement"],
            **{f"text_{k}": v for k, v in fed.items()}, **{f"generated_{k}": v for k, v in generated.items()},
            "format": _format(bits, model_geometry(loaded.model).head_dim).name}


def _compare(model, bits: int, prompt: list[int], steps: int, follow: list[int] | None = None) -> dict:
    """Feed both caches the prompt, then ``steps`` tokens one at a time: ``follow``'s, or what the float
    cache picks greedily. KL(float || quantized) of each step's next-token distribution, and how often
    the quantized cache's pick is the float one's."""
    forward = CompiledForward(model)
    caches = {"float": _cache(model, None), "quantized": _cache(model, bits)}
    for cache in caches.values():
        prefill(forward, cache, prompt[:-1], current().prefill_chunk)
    kls, agree, token = [], 0, prompt[-1]
    for step in range(steps):
        rows = {}
        for name, cache in caches.items():
            rows[name] = forward_rows(forward, cache, [token])[-1].astype(mx.float32)
        p, q = (row - mx.logsumexp(row) for row in (rows["float"], rows["quantized"]))
        kl, mine, theirs = mx.sum(mx.exp(p) * (p - q)), mx.argmax(p), mx.argmax(q)
        mx.eval(kl, mine, theirs)
        kls.append(kl.item())
        agree += mine.item() == theirs.item()
        token = follow[step] if follow is not None else mine.item()
    return {"kl_mean": statistics.fmean(kls), "kl_median": statistics.median(kls), "kl_max": max(kls),
            "agreement": agree / steps}


def _format(bits: int, head_dim: int) -> KVFormat:
    """``bits`` in the group size mlxchat would use, also for bits it does not offer (measured here only)."""
    group = kv_format(8, head_dim).group_size
    return KVFormat(bits, group)


def _cache(model, bits: int | None) -> PagedCache:
    geometry = model_geometry(model)
    if bits is not None:
        geometry = dataclasses.replace(geometry, format=_format(bits, geometry.head_dim))
    return PagedCache(BlockPool(geometry, PoolConfig()))


def _tokens(tokenizer, count: int) -> list[int]:
    ids = tokenizer.encode(TEXT.read_text())
    while len(ids) < count:
        ids = ids + ids
    return ids[:count]
