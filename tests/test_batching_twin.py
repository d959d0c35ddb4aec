"""Batching on the 0.6B twin (Qwen3's geometry, 4-bit weights with bf16 scales, 151,936-token vocabulary).

Batched decoding runs other matrix shapes than one sequence alone (B rows instead of one), so float
rounding can differ; the tolerance: every sequence's greedy tokens agree with its run alone in at least
90% of positions (measured: all of them).
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)

from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.bench.batch_load import stream_prompt
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from twin_fixtures import twin_06b, twins_root  # noqa: F401

TOKENS = 12


def test_a_batch_of_four_decodes_as_each_alone(twin_06b):  # noqa: F811
    loaded = load_model(str(twin_06b))
    vocab = loaded.model.args.vocab_size
    prompts = [stream_prompt(vocab, s, 20 + 9 * s) for s in range(4)]
    params = GenerationParams(max_tokens=TOKENS)

    def engine() -> Engine:
        made = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"))
        made.eos_ids = set()
        return made

    alone = []
    for p in prompts:
        e = engine()
        alone.append([ev.token for ev in e.generate(p, e.new_caches(), params) if isinstance(ev, TokenEvent)])
    batch = LocalBatch(engine())
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    got = [[] for _ in handles]
    while batch.busy:
        batch.step()
        for tokens, handle in zip(got, handles):
            tokens.extend(e.token for e in drain(handle) if isinstance(e, TokenEvent))
    assert batch.runner.tally.mean_batch_size > 3
    for index, (mine, theirs) in enumerate(zip(got, alone)):
        assert len(mine) == TOKENS
        same = sum(a == b for a, b in zip(mine, theirs))
        assert same >= 0.9 * TOKENS, f"sequence {index}: {same} of {TOKENS} tokens as alone"
