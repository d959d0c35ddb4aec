"""One side of row ``tp2_decode_vs_single``: plain greedy decode tok/s of the model as this process's world runs it.

Run as ``python -m bench.tp_probe MODEL TOKENS RUNS``, alone or under
``mlx.launch -n 2 --backend ring``. Every rank loads its shard as ``mlxchat``
does (``open_engine``) and decodes the same tokens; rank 0 prints one JSON line:
the median tok/s of RUNS replies of exactly TOKENS tokens (EOS ignored, after one
warm-up reply), and the latency of the collective every layer calls twice per
token (``all_sum`` of one token's hidden vector, the model's dtype), so that the
communication's share of a step can be stated beside the rate.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx

from bench.decode import PROMPT
from bench.timing import stream_rate
from mlxcore.chat_template import render_chat
from mlxcore.configs import KVConfig, ModelChoice
from mlxcore.events import TokenEvent
from mlxcore.launch import open_engine
from mlxcore.params import GenerationParams

COLLECTIVE_CALLS = 200


def main(model: str, tokens: int, runs: int) -> None:
    opened = open_engine(ModelChoice(model=model, no_draft=True), KVConfig(kind="paged"))
    engine = opened.engine
    engine.eos_ids = set()  # every reply runs to exactly `tokens` tokens
    ids = render_chat(engine.tokenizer, [{"role": "user", "content": PROMPT}], enable_thinking=False)
    params = GenerationParams(max_tokens=tokens)
    rates = [stream_rate(engine.generate(ids, engine.new_caches(), params),
                         lambda e: isinstance(e, TokenEvent))[0] for _ in range(runs + 1)][1:]
    args = engine.model.args
    figures = {"tps": statistics.median(rates), "rates": rates, "world_size": engine.world.size,
               "layers": args.num_hidden_layers,
               "all_sum_seconds": _all_sum_seconds(engine.world, args.hidden_size, engine.model)}
    if engine.world.leader:
        print(json.dumps(figures), flush=True)


def _all_sum_seconds(world, hidden: int, model) -> float | None:
    """Seconds per ``all_sum`` of a (1, 1, hidden) vector of the model's dtype (None in one process)."""
    if not world.distributed:
        return None
    vector = mx.ones((1, 1, hidden), dtype=model.model.embed_tokens.weight.dtype)
    mx.eval(mx.distributed.all_sum(vector, group=world.group))
    start = time.perf_counter()
    for _ in range(COLLECTIVE_CALLS):
        mx.eval(mx.distributed.all_sum(vector, group=world.group))
    return (time.perf_counter() - start) / COLLECTIVE_CALLS


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
