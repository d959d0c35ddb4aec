"""Batching on the 0.6B twin (Qwen3's geometry, 4-bit weights with bf16 scales, 151,936-token vocabulary).

Batched decoding runs other matrix shapes than one sequence alone (B rows instead of one), so float
rounding can differ; the tolerance: every sequence's greedy tokens agree with its run alone in at least
90% of positions (measured: all of them, here and with a 300-token prompt joining on the 4-bit twin).
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)

from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from bench.batch_load import stream_prompt
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from twin_fixtures import twin_06b, twin_06b_f32, twins_root  # noqa: F401

TOKENS = 12


def engine_of(loaded) -> Engine:
    made = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"))
    made.eos_ids = set()
    return made


def alone(loaded, prompt: list[int], params: GenerationParams) -> list[int]:
    e = engine_of(loaded)
    return [ev.token for ev in e.generate(prompt, e.new_caches(), params) if isinstance(ev, TokenEvent)]


def assert_as_alone(got: list[list[int]], expected: list[list[int]]) -> None:
    for index, (mine, theirs) in enumerate(zip(got, expected)):
        assert len(mine) == len(theirs)
        same = sum(a == b for a, b in zip(mine, theirs))
        assert same >= 0.9 * len(theirs), f"sequence {index}: {same} of {len(theirs)} tokens as alone"


def test_a_batch_of_four_decodes_as_each_alone(twin_06b):  # noqa: F811
    loaded = load_model(str(twin_06b))
    vocab = loaded.model.args.vocab_size
    prompts = [stream_prompt(vocab, s, 20 + 9 * s) for s in range(4)]
    params = GenerationParams(max_tokens=TOKENS)

    expected = [alone(loaded, p, params) for p in prompts]
    batch = LocalBatch(engine_of(loaded))
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    got = [[] for _ in handles]
    while batch.busy:
        batch.step()
        for tokens, handle in zip(got, handles):
            tokens.extend(e.token for e in drain(handle) if isinstance(e, TokenEvent))
    assert batch.runner.tally.mean_batch_size > 3
    assert_as_alone(got, expected)


def test_a_long_prompt_joins_two_streams_in_chunks_through_every_layer(twin_06b_f32):  # noqa: F811
    """28 layers of Qwen3's geometry: the joining prompt's chunks ride in the streams' passes over several
    steps (a small step budget), and everyone answers as alone."""
    loaded = load_model(str(twin_06b_f32))
    vocab = loaded.model.args.vocab_size
    prompts = [stream_prompt(vocab, 1, 40), stream_prompt(vocab, 2, 60), stream_prompt(vocab, 3, 300)]
    lengths = [40, 40, TOKENS]
    batch = LocalBatch(engine_of(loaded), step_tokens=64)
    handles = [batch.submit(Request(tuple(p), GenerationParams(max_tokens=n)))[0] for p, n in zip(prompts[:2], lengths)]
    for _ in range(3):
        batch.step()
    handles.append(batch.submit(Request(tuple(prompts[2]), GenerationParams(max_tokens=TOKENS)))[0])
    got, part_way = [[] for _ in handles], 0
    while batch.busy:
        batch.step()
        read = batch.runner.tokens_read(handles[2].request_id)
        part_way += read is not None and 0 < read < len(prompts[2])
        for tokens, handle in zip(got, handles):
            tokens.extend(e.token for e in drain(handle) if isinstance(e, TokenEvent))
    assert part_way >= 3, "the prompt was read over several steps beside the streams"
    assert_as_alone(got, [alone(loaded, p, GenerationParams(max_tokens=n)) for p, n in zip(prompts, lengths)])
