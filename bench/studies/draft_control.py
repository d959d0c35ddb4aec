"""The draft-length controller in the engine, without a server: adaptive drafting against plain decoding and
against fixed draft lengths, on the embedded pair.

``REPLIES`` replies of the bench's questions (Qwen3's chat template, greedy, at most 128 tokens) run side by
side in one ``LocalBatch``; each one that ends is replaced by the next question until ``4 x REPLIES`` have
ended (as ``spec_batch*_vs_plain``'s clients do, without HTTP). Each mode has its own engine; the modes run
alternated, ``ROUNDS`` times after two warm-up loads each, and the study prints each mode's output tok/s and the
ratio of its median to plain decoding's. Modes: ``plain`` (no draft), ``adaptive`` (the engine's controller),
``k1`` ... ``k8`` (a round of that length every step, ``FixedDraftLength``).

Run from the project's root: ``.venv/bin/python bench/studies/draft_control.py [REPLIES] [ROUNDS] [MODE ...]``
(defaults: 2 replies, 5 rounds, plain adaptive k4). Figures: docs/engine.md (2026-11-30, ninth session).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlxcore  # noqa: E402,F401  (optimized BLAS before mlx)
from bench.draft_lengths import FixedDraftLength  # noqa: E402
from bench.serve_load import QUESTIONS  # noqa: E402
from mlxcore.batching.local import LocalBatch, drain  # noqa: E402
from mlxcore.batching.request import Request  # noqa: E402
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.events import FinalEvent, TokenEvent  # noqa: E402
from mlxcore.loading import load_model  # noqa: E402
from mlxcore.params import GenerationParams  # noqa: E402

TARGET, DRAFT = load_model("mini-target"), load_model("mini-draft")
PARAMS = GenerationParams(max_tokens=128)


def engine(mode: str) -> Engine:
    made = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged", block_size=16),
                  draft_model=None if mode == "plain" else DRAFT.model)
    if mode.startswith("k"):
        made.draft_control = FixedDraftLength(int(mode[1:]))
    return made


def prompt(index: int) -> tuple[int, ...]:
    messages = [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]
    return tuple(TARGET.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def load(made: Engine, replies: int) -> float:
    """Output tok/s of one load: ``replies`` at a time until ``4 x replies`` have ended."""
    batch = LocalBatch(made)
    handles = [batch.submit(Request(prompt(i), PARAMS))[0] for i in range(replies)]
    submitted, tokens, start = replies, 0, time.perf_counter()
    while batch.busy:
        batch.step()
        for slot, handle in enumerate(handles):
            for event in drain(handle):
                if isinstance(event, TokenEvent):
                    tokens += 1
                elif isinstance(event, FinalEvent) and submitted < 4 * replies:
                    handles[slot] = batch.submit(Request(prompt(submitted), PARAMS))[0]
                    submitted += 1
    return tokens / (time.perf_counter() - start)


def main() -> None:
    replies = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    modes = sys.argv[3:] or ["plain", "adaptive", "k4"]
    engines = {mode: engine(mode) for mode in modes}
    for made in engines.values():  # warm up: compiled shapes, and the controller's learning
        load(made, replies)
        load(made, replies)
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode in modes:
            rates[mode].append(load(engines[mode], replies))
    base = statistics.median(rates[modes[0]])
    for mode in modes:
        print(f"{mode:9s} tok/s {[round(rate) for rate in rates[mode]]}  median / {modes[0]}'s: "
              f"{statistics.median(rates[mode]) / base:.3f}")


if __name__ == "__main__":
    main()
