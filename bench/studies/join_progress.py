"""``prefill_steps_8k``'s twin half with progress: an 8,000-token prompt joins 4 decoding streams on the float32
0.6B twin (``bench.batching.join_steps``, without the row's warm-up join); every 25 steps, the seconds since it
joined and the prompt tokens read so far; at the end, the steps and seconds to its first token.

Run from the project's root: ``.venv/bin/python bench/studies/join_progress.py [TOKENS]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

import mlxcore  # noqa: F401,E402  (optimized BLAS before mlx)
from bench.batch_load import long_prompt  # noqa: E402
from bench.batching import _engine, join_steps  # noqa: E402
from bench.twins import twin_folder  # noqa: E402
from mlxcore.device_profile import current  # noqa: E402


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    engine = _engine(str(twin_folder("qwen3-0.6b", bits=None)))
    print(f"profile {current().kind}, step budget {current().step_tokens} tokens", flush=True)

    def progress(batch, steps: int, seconds: float) -> None:
        if steps % 25 == 0:
            reading = [s for s in batch.runner.sequences.values() if s.prompt_tokens >= tokens]
            print(f"step {steps} {seconds:.0f}s read {reading[0].cached if reading else -1}", flush=True)

    print(join_steps(engine, long_prompt(engine.model.args.vocab_size, tokens), progress), flush=True)


if __name__ == "__main__":
    main()
