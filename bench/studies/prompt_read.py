"""First-token seconds of prompts read with nothing else decoding, on the paged pool, through the runner.

Two loads: ``ask`` (``Engine.generate``: one prompt, a prefill chunk a step) and ``wave`` (``--prompts``
prompts submitted at once to a ``LocalBatch``, the server's token budget a step: seconds until each has its
first token). A new prompt every run (no prefix hit); the first run warms up and is dropped. Prints one JSON
line. Compare two trees by running each tree's copy alternately, from its root:

``.venv/bin/python bench/studies/prompt_read.py ask [--model REF] [--tokens 2000] [--repeats 3]``
``.venv/bin/python bench/studies/prompt_read.py wave [--model REF] [--tokens 500] [--prompts 4] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

import mlxcore  # noqa: F401,E402  (optimized BLAS before mlx)

from mlxcore.batching.local import LocalBatch  # noqa: E402
from mlxcore.batching.request import Request  # noqa: E402
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.loading import load_model  # noqa: E402
from mlxcore.params import GenerationParams  # noqa: E402


def prompt(vocab: int, tokens: int, seed: int) -> list[int]:
    return [(i * 7919 + 31 * seed) % vocab for i in range(tokens)]


def ask(engine: Engine, vocab: int, tokens: int, run: int) -> float:
    caches = engine.new_caches()
    start = time.perf_counter()
    for _ in engine.generate(prompt(vocab, tokens, 1000 * run), caches, GenerationParams(max_tokens=1)):
        break
    seconds = time.perf_counter() - start
    caches.release()
    return seconds


def wave(engine: Engine, vocab: int, tokens: int, prompts: int, run: int) -> list[float]:
    batch = LocalBatch(engine, max_running=prompts)
    handles = [batch.submit(Request(tuple(prompt(vocab, tokens, 1000 * run + p)), GenerationParams(max_tokens=2)))[0]
               for p in range(prompts)]
    start, first = time.perf_counter(), {}
    while len(first) < prompts and batch.busy:
        batch.step()
        for handle in handles:
            if handle.request_id not in first and handle.unread:
                first[handle.request_id] = time.perf_counter() - start
    batch.run_until(lambda: not batch.busy)
    return sorted(first.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("load", choices=("ask", "wave"))
    parser.add_argument("--model", default="mini-target")
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    loaded = load_model(args.model)
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"))
    engine.warm_up()
    vocab = loaded.model.args.vocab_size
    tokens = args.tokens or (2000 if args.load == "ask" else 500)
    runs = [ask(engine, vocab, tokens, run) if args.load == "ask" else wave(engine, vocab, tokens, args.prompts, run)
            for run in range(args.repeats + 1)]
    print(json.dumps({"load": args.load, "model": args.model, "tokens": tokens, "seconds": runs[1:]}))


if __name__ == "__main__":
    main()
