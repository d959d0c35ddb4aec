"""Prefill seconds of one prompt by chunk size, on this device's branches, alternated between sizes.

Usage: .venv/bin/python bench/studies/prefill_chunks.py MODEL TOKENS ROUNDS [CHUNK ...]
Prints the median seconds per chunk size and each one's ratio to the device profile's chunk; the figures
behind ``device_profile``'s ``prefill_chunk`` (docs/device-profile.md).
"""

from __future__ import annotations

import statistics
import sys
import time

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
from mlxcore.compiled_forward import CompiledForward
from mlxcore.device_profile import current
from mlxcore.kv.model_cache import make_model_cache
from mlxcore.loading import load_model
from mlxcore.prefill import prefill


def main(model_ref: str, tokens: int, rounds: int, chunks: list[int]) -> None:
    model = load_model(model_ref).model
    forward = CompiledForward(model)
    ids = [(i * 7919) % model.args.vocab_size for i in range(tokens)]  # content does not matter for speed
    chosen = current().prefill_chunk
    chunks = sorted(set(chunks) | {chosen})
    seconds: dict[int, list[float]] = {c: [] for c in chunks}
    for round_ in range(rounds + 1):  # the first round warms up every size
        for chunk in chunks if round_ % 2 else reversed(chunks):
            cache = make_model_cache(model, "paged")
            start = time.perf_counter()
            prefill(forward, cache, ids, chunk)
            if round_:
                seconds[chunk].append(time.perf_counter() - start)
            cache.release()
    base = statistics.median(seconds[chosen])
    print(f"{model_ref}, {tokens} tokens, {current().kind} profile, medians of {rounds} alternated rounds")
    for chunk in chunks:
        median = statistics.median(seconds[chunk])
        print(f"  chunk {chunk:>5}: {median:7.3f} s   {median / base:5.2f} x the profile's ({chosen})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(c) for c in sys.argv[4:]] or [32, 64, 256, 512, 2048])
