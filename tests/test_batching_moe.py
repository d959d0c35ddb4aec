"""Continuous batching of a Qwen3-MoE model (a tiny random one): each request's tokens equal it run alone."""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)

from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from bench.batch_load import stream_prompt
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from tiny_models import tiny_qwen3_moe

MODEL, TOKENIZER = tiny_qwen3_moe(seed=5), load_model("mini-target").tokenizer  # the same 2,048-token vocabulary


def engine() -> Engine:
    made = Engine(MODEL, TOKENIZER, kv=KVConfig(kind="paged"))
    made.eos_ids = set()  # replies run to max_tokens
    return made


def test_a_batch_of_moe_requests_decodes_as_each_alone():
    params = GenerationParams(max_tokens=12)
    prompts = [stream_prompt(MODEL.args.vocab_size, s, 5 + 23 * s) for s in range(4)]
    batch = LocalBatch(engine(), max_running=8)
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    got = {h.request_id: [] for h in handles}
    while batch.busy:
        batch.step()
        for handle in handles:
            got[handle.request_id] += [e.token for e in drain(handle) if isinstance(e, TokenEvent)]
    assert batch.runner.tally.largest_batch == 4
    reference = engine()
    for handle, prompt in zip(handles, prompts):
        alone = [e.token for e in reference.generate(prompt, reference.new_caches(), params)
                 if isinstance(e, TokenEvent)]
        assert got[handle.request_id] == alone
