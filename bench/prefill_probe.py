"""Times the prefill of one prompt; run as a subprocess by the `blas_speedup` row.

Usage: python -m bench.prefill_probe MODEL TOKENS REPEATS
Prints one JSON line: {"blas": library or null, "seconds": [...]}.
"""

from __future__ import annotations

import json
import sys
import time

import mlxcore.blas
from mlxcore.device_profile import current
from mlxcore.engine import Engine, KVConfig
from mlxcore.loading import load_model
from mlxcore.prefill import prefill


def main(model_ref: str, tokens: int, repeats: int) -> None:
    loaded = load_model(model_ref)
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="standard"))
    vocab = loaded.model.args.vocab_size
    ids = [(i * 7919) % vocab for i in range(tokens)]  # a fixed prompt; the content does not matter for speed
    seconds = []
    for _ in range(repeats + 1):  # the first run warms up
        cache = engine.new_caches().target
        start = time.perf_counter()
        prefill(engine.target_forward, cache, ids, chunk=current().prefill_chunk)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"blas": mlxcore.blas.loaded_library, "seconds": seconds[1:]}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
