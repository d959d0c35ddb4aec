"""What a plain step costs while a block drafter's context is kept, at several context lengths.

``.venv/bin/python bench/studies/block_context_cost.py [ROUNDS] [TOKENS]`` from a tree's root: greedy replies of
TOKENS tokens on the embedded target after prompts of 100, 1,000 and 3,000 tokens, every step plain (k = 0) so
that each one only feeds the context (``BlockDrafter.took``), with the trained drafter
(``assets/models/mini-dflash``) and without a drafter; the rounds alternate, the best of them is printed, in ms a
decode step. Also the context's own append of one row at each length (best of 50).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

import mlxcore  # noqa: F401,E402  (optimized BLAS before mlx)
import mlx.core as mx  # noqa: E402

from bench.batch_load import stream_prompt  # noqa: E402
from bench.block_draft import MINI_BLOCK  # noqa: E402
from bench.draft_lengths import FixedDraftLength  # noqa: E402
from mlxcore.block_drafter import BlockContext, load_block_drafter  # noqa: E402
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.loading import load_model  # noqa: E402
from mlxcore.params import GenerationParams  # noqa: E402

LENGTHS = (100, 1_000, 3_000)


def step_ms(engine: Engine, prompt: list[int], tokens: int) -> float:
    """ms a decode step of one greedy reply (its first token, the prefill's, not counted)."""
    stats = engine.last_stats if list(engine.generate(prompt, engine.new_caches(),
                                                      GenerationParams(max_tokens=tokens))) else None
    assert stats is not None and stats.generated_tokens == tokens
    return 1000 * stats.decode_seconds / (tokens - 1)


def append_ms(drafter_layers: int, kv_heads: int, dim: int, length: int, tries: int = 50) -> float:
    """ms to append one row to a context of ``length`` rows and evaluate it (best of ``tries``)."""
    context = BlockContext()
    rows = [(mx.random.normal((1, kv_heads, length, dim)), mx.random.normal((1, kv_heads, length, dim)))
            for _ in range(drafter_layers)]
    context.append(0, rows)
    one = [(k[:, :, :1], v[:, :, :1]) for k, v in rows]
    mx.eval([part for both in context.layers for part in both], one)
    best = float("inf")
    for i in range(tries):
        context.trim(length + i)  # (a no-op: a step's append lands at the end)
        began = time.perf_counter()
        context.append(length + i, one)
        mx.eval([part for both in context.layers for part in both])
        best = min(best, time.perf_counter() - began)
    return 1000 * best


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    target = load_model("mini-target")
    drafter = load_block_drafter(MINI_BLOCK, target.model)
    engines = {"block": Engine(target.model, target.tokenizer, kv=KVConfig(kind="paged"), block_drafter=drafter),
               "plain": Engine(target.model, target.tokenizer, kv=KVConfig(kind="paged"))}
    engines["block"].draft_control = FixedDraftLength(0)  # every step plain: it only feeds the context
    for engine in engines.values():
        engine.eos_ids = set()  # every reply runs to TOKENS
    prompts = {n: stream_prompt(target.tokenizer.vocab_size, n, n) for n in LENGTHS}
    for engine in engines.values():
        step_ms(engine, prompts[LENGTHS[0]], 8)  # warm up
    best = {(name, n): float("inf") for name in engines for n in LENGTHS}
    for r in range(rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for n in LENGTHS:
            for name in order:
                best[name, n] = min(best[name, n], step_ms(engines[name], prompts[n], tokens))
    c = drafter.config
    print(f"{'context':>8} {'block ms/step':>14} {'plain ms/step':>14} {'append ms':>10}")
    for n in LENGTHS:
        append = append_ms(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, n)
        print(f"{n:>8} {best['block', n]:>14.2f} {best['plain', n]:>14.2f} {append:>10.3f}")


if __name__ == "__main__":
    main()
