"""``prefill_steps_8k``'s twin half with progress: an 8,000-token prompt joins 4 decoding streams on the float32
0.6B twin; every 25 steps, the seconds since it joined and the prompt tokens read so far; at the end, the steps
and seconds to its first token (``bench.batching.join_steps``' measure, without the row's warm-up join).

Run from the project's root: ``.venv/bin/python bench/studies/join_progress.py [TOKENS]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

import mlxcore  # noqa: F401,E402  (optimized BLAS before mlx)
from bench.batch_load import JOIN_RUNNING, JOIN_RUNNING_TOKENS, batch_prompts, long_prompt  # noqa: E402
from bench.batching import _engine  # noqa: E402
from bench.mlx_lm_batch import JOIN_AFTER  # noqa: E402
from bench.twins import twin_folder  # noqa: E402
from mlxcore.batching.local import LocalBatch, drain  # noqa: E402
from mlxcore.batching.request import Request  # noqa: E402
from mlxcore.device_profile import current  # noqa: E402
from mlxcore.events import TokenEvent  # noqa: E402
from mlxcore.params import GenerationParams  # noqa: E402


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    engine = _engine(str(twin_folder("qwen3-0.6b", bits=None)))
    vocab = engine.model.args.vocab_size
    print(f"profile {current().kind}, join chunk {current().join_chunk}", flush=True)
    batch = LocalBatch(engine, max_running=JOIN_RUNNING + 1)
    params = GenerationParams(max_tokens=JOIN_RUNNING_TOKENS)
    running = [batch.submit(Request(tuple(p), params))[0] for p in batch_prompts(vocab, JOIN_RUNNING)]
    made = [0] * JOIN_RUNNING
    while min(made) < JOIN_AFTER:
        batch.step()
        made = [count + sum(isinstance(e, TokenEvent) for e in drain(h)) for count, h in zip(made, running)]
    start = time.perf_counter()
    joined = batch.submit(Request(tuple(long_prompt(vocab, tokens)), GenerationParams(max_tokens=1)))[0]
    steps = 0
    while not any(isinstance(e, TokenEvent) for e in drain(joined)):
        batch.step()
        steps += 1
        for handle in running:  # read, as a client does: an unread stream would be paused
            list(drain(handle))
        if steps % 25 == 0:
            reading = [s for s in batch.runner.sequences.values() if s.prompt_tokens >= tokens]
            print(f"step {steps} {time.perf_counter() - start:.0f}s read {reading[0].cached if reading else -1}",
                  flush=True)
    print({"steps": steps, "seconds": time.perf_counter() - start, "prompt_tokens": tokens}, flush=True)


if __name__ == "__main__":
    main()
