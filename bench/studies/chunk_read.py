"""A 2,048-token prompt read with nothing else running, two ways: ``prefill()`` (``CompiledForward.body``,
every layer for one chunk before the next) and the batch pass (``BatchDecoder`` with the prompt's chunks as
its only rows, through every layer, as a chunk rides beside decoding rows). Seconds for each, three rounds
alternated, for each chunk length given.

Run from the project's root: ``.venv/bin/python bench/studies/chunk_read.py [--model REF] [CHUNK ...]``
(default: the embedded target, chunks of 128 and 512).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

import mlxcore  # noqa: F401,E402  (optimized BLAS before mlx)
import mlx.core as mx  # noqa: E402

from bench.batch_load import stream_prompt  # noqa: E402
from bench.batching import _engine  # noqa: E402
from mlxcore.batching.batch_forward import BatchDecoder  # noqa: E402
from mlxcore.batching.prompt_feed import PromptFeed  # noqa: E402
from mlxcore.prefill import prefill  # noqa: E402

TOKENS = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mini-target")
    parser.add_argument("chunks", nargs="*", type=int, default=[128, 512])
    args = parser.parse_args()
    engine = _engine(args.model)
    forward, vocab = engine.target_forward, engine.model.args.vocab_size
    decoder = BatchDecoder(forward)

    def by_prefill(ids: list[int], chunk: int) -> float:
        caches = engine.new_caches()
        start = time.perf_counter()
        prefill(forward, caches.target, ids, chunk)
        seconds = time.perf_counter() - start
        caches.release()
        return seconds

    def by_batch_pass(ids: list[int], chunk: int) -> float:
        caches = engine.new_caches()
        start = time.perf_counter()
        for at in range(0, len(ids), chunk):
            feed = PromptFeed(forward, caches.target, ids[at:at + chunk])
            decoder([], [], None, [feed])
            mx.eval(feed.h)
            feed.ran()
        seconds = time.perf_counter() - start
        caches.release()
        return seconds

    for chunk in args.chunks:
        by_prefill(stream_prompt(vocab, 1, TOKENS), chunk), by_batch_pass(stream_prompt(vocab, 2, TOKENS), chunk)
        for round_ in range(3):  # a new prompt each time: nothing found cached
            alone = by_prefill(stream_prompt(vocab, 10 + 2 * round_, TOKENS), chunk)
            batched = by_batch_pass(stream_prompt(vocab, 11 + 2 * round_, TOKENS), chunk)
            print(f"chunk {chunk}: prefill {alone:.3f} s, batch pass {batched:.3f} s ({batched / alone:.2f} x)",
                  flush=True)


if __name__ == "__main__":
    main()
