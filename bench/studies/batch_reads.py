"""Aggregate decode tok/s of 8 streams on the paged cache, float and 8-bit keys and values, alternated.

Run from a tree's root to compare two trees (issue 32's batch read paths):
``.venv/bin/python bench/studies/batch_reads.py [MODEL] [ROUNDS]``; prints one line a measure and the
medians. The load is ``batch8_throughput_vs_single``'s (8 greedy streams of 256 tokens, none ending early).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

import mlxcore  # noqa: F401,E402  (optimized BLAS before mlx)
from bench.batch_load import REPLY_TOKENS, batch_prompts  # noqa: E402
from bench.batching import decode_streams  # noqa: E402
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.loading import load_model  # noqa: E402


def main() -> None:
    model_ref = sys.argv[1] if len(sys.argv) > 1 else "mini-target"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    loaded = load_model(model_ref)
    engines = {}
    for name, bits in (("float", None), ("kv8", 8)):
        engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged", kv_bits=bits))
        engine.eos_ids = set()
        engine.warm_up()
        engines[name] = engine
    prompts = batch_prompts(loaded.model.args.vocab_size)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(rounds + 1):  # the first round warms both up
        for name, engine in engines.items():
            start = time.perf_counter()
            traces = decode_streams(engine, prompts, REPLY_TOKENS)
            tokens = sum(len(trace.tokens) for trace in traces)
            rate = tokens / (time.perf_counter() - start)
            if round_:
                rates[name].append(rate)
            print(f"round {round_} {name}: {rate:.1f} tok/s", flush=True)
    for name, values in rates.items():
        print(f"median {name}: {statistics.median(values):.1f} tok/s")


if __name__ == "__main__":
    main()
