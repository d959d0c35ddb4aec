"""Hybrid models' replies side by side (``mlxcore/batching/hybrid_batch.py``): each equals the same reply alone.

On a tiny Qwen3.5 and a tiny Qwen3-Next (float32, mlx-lm's model code) and on the Qwen3.5-9B twin, requests
that join at different steps, end at different lengths or are cancelled decode in one pass a step; each reply
must be mlx-lm's ``stream_generate`` tokens for its prompt alone (greedy), or our own reply alone with the same
seed (sampled), and the caches a batched reply leaves must hold what the same reply alone leaves, so that a
chat's next turn goes on from them as from its own.
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import pytest
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from assets import MODELS_DIR
from bench.twins import twin_folder
from mlxcore import GenerationParams, KVConfig, TokenEvent, open_engine
from mlxcore.batching.hybrid_batch import HybridBatchDecoder
from mlxcore.batching.local import LocalBatch
from mlxcore.batching.request import Request
from test_batching_runner import Collector
from tiny_models import tiny_hybrid, tiny_hybrid_config, tiny_qwen3_next, tiny_qwen3_next_config, write_model_folder
from twin_fixtures import twins_root  # noqa: F401

FAMILIES = {"qwen3_5": (tiny_hybrid, tiny_hybrid_config), "qwen3_next": (tiny_qwen3_next, tiny_qwen3_next_config)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def folder(request, tmp_path_factory):
    model, config = FAMILIES[request.param]
    return write_model_folder(model(), tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}",
                              MODELS_DIR / "mini-target", config=config())


def engine_of(folder, max_kv_bytes: int | None = None):
    engine = open_engine(str(folder), kv=KVConfig(kind="standard", max_kv_bytes=max_kv_bytes)).engine
    engine.eos_ids = set()  # replies run to max_tokens
    return engine


def mlx_lm_tokens(folder, prompts: list[list[int]], counts: list[int]) -> list[list[int]]:
    model, tokenizer = load(str(folder))
    tokenizer.eos_token_ids = set()  # as ``engine_of``: replies run to their length
    return [[r.token for r in stream_generate(model, tokenizer, p, max_tokens=n, sampler=make_sampler(0.0))]
            for p, n in zip(prompts, counts)]


def alone(engine, prompt: list[int], params: GenerationParams) -> tuple[list[int], object]:
    caches = engine.new_caches()
    tokens = [e.token for e in engine.generate(prompt, caches, params) if isinstance(e, TokenEvent)]
    return tokens, caches


def test_replies_joining_ending_and_cancelled_are_each_mlx_lms_alone(folder):
    """Five requests (one of a single token, whose states start empty) join at two steps and end at three
    lengths; a sixth is cancelled part way. One pass a step serves them all."""
    engine = engine_of(folder)
    batch = Collector(LocalBatch(engine, max_running=8))
    prompts = [list(range(100 + s, 105 + 17 * s + s)) for s in range(4)] + [[300], list(range(700, 730))]
    counts = [30, 12, 30, 21, 30, 30]
    handles = [batch.submit(Request(tuple(p), GenerationParams(temperature=0.0, max_tokens=n)))[0]
               for p, n in zip(prompts[:2], counts[:2])]
    batch.step(4)
    handles += [batch.submit(Request(tuple(p), GenerationParams(temperature=0.0, max_tokens=n)))[0]
                for p, n in zip(prompts[2:], counts[2:])]
    batch.step(6)
    cancelled = handles[-1]
    cancelled.cancel()
    batch.run()
    expected = mlx_lm_tokens(folder, prompts, counts)
    for index, (handle, want) in enumerate(zip(handles, expected)):
        got = batch.tokens(handle)
        if handle is cancelled:
            assert batch.final(handle).finish_reason == "cancelled" and 0 < len(got) < len(want)
            assert got == want[:len(got)]
            continue
        assert got == want, f"request {index} differs from mlx-lm's reply to its prompt alone"
    runner = batch.batch.runner
    assert runner.tally.largest_batch == 6, "they decoded together"
    assert not runner.decoder._rows, "with nothing decoding, the batch's view went back"


def test_sampled_rows_draw_as_each_alone_with_its_seed(folder):
    engine = engine_of(folder)
    batch = Collector(LocalBatch(engine, max_running=4))
    params = [GenerationParams(temperature=t, top_p=0.95, top_k=20, max_tokens=24, seed=s)
              for t, s in ((0.6, 1), (0.9, 2), (0.6, 3))]
    prompts = [list(range(200 + 7 * s, 230 + 11 * s)) for s in range(3)]
    handles = [batch.submit(Request(tuple(p), q))[0] for p, q in zip(prompts, params)]
    batch.run()
    assert batch.batch.runner.tally.largest_batch == 3
    for handle, p, q in zip(handles, prompts, params):
        assert batch.tokens(handle) == alone(engine, p, q)[0]


def test_the_view_is_built_once_per_change_of_the_batch(folder, monkeypatch):
    """Steps of the same sequences read the view they left (no copy of their KV a step); a sequence that
    ends, or joins, makes one new view."""
    built = []
    original = HybridBatchDecoder._build
    monkeypatch.setattr(HybridBatchDecoder, "_build", lambda self, caches: (built.append(len(caches)),
                                                                            original(self, caches)))
    engine = engine_of(folder)
    batch = Collector(LocalBatch(engine, max_running=4))
    prompts = [list(range(100, 120)), list(range(400, 431)), list(range(900, 905))]
    counts = [20, 8, 20]
    handles = [batch.submit(Request(tuple(p), GenerationParams(temperature=0.0, max_tokens=n)))[0]
               for p, n in zip(prompts, counts)]
    batch.run()
    assert [batch.tokens(h) for h in handles] == mlx_lm_tokens(folder, prompts, counts)
    assert built == [3, 2], "one view for the three, one when the short reply ended"


def test_a_batched_replys_caches_hold_what_alone_leaves_and_its_chat_goes_on(folder):
    """Kept caches (a chat's): their keys, values and linear states are the same reply's alone; the next turn on
    them equals mlx-lm's reply to the whole conversation read from nothing."""
    engine = engine_of(folder)
    params = GenerationParams(temperature=0.0, max_tokens=16)
    prompts = [list(range(100, 140)), list(range(500, 511)), list(range(1200, 1227))]
    batch = Collector(LocalBatch(engine, max_running=4))
    handles = [batch.submit(Request(tuple(p), params, keep_caches=True))[0] for p in prompts]
    batch.run()
    for handle, prompt in zip(handles, prompts):
        tokens, own = alone(engine, prompt, params)
        kept = handle.caches.target
        assert batch.tokens(handle) == tokens and handle.caches.tokens == own.tokens
        for mine, theirs in zip(kept.layers, own.target.layers):
            pairs = [(mine[0], theirs[0]), (mine[1], theirs[1])] if hasattr(mine, "advance") and not hasattr(
                mine, "keys") else [(mine.keys[..., :mine.offset, :], theirs.keys[..., :theirs.offset, :]),
                                    (mine.values[..., :mine.offset, :], theirs.values[..., :theirs.offset, :])]
            for a, b in pairs:
                assert a.shape == b.shape and mx.allclose(a, b, atol=1e-4).item()
        follow_up = [*handle.caches.tokens, 7, 8, 9]
        second = Collector(LocalBatch(engine, max_running=4))
        next_turn = second.submit(Request(tuple(follow_up), params, caches=handle.caches))[0]
        second.run()
        assert second.tokens(next_turn) == mlx_lm_tokens(folder, [follow_up], [16])[0]
        assert second.final(next_turn).stats.reused_tokens == len(follow_up) - 3


def test_the_qwen35_twin_batched_equals_each_alone(twins_root):
    """The Qwen3.5-9B twin (float32; its layer pattern, linear heads, partial rotary, 151,936-token vocabulary):
    three chats' prompts of different lengths side by side, each mlx-lm's reply alone."""
    folder = twin_folder("qwen3.5-9b", bits=None, root=twins_root)
    engine = engine_of(folder)
    tokenizer = engine.tokenizer
    questions = ["What is 12 + 7?", "Name three colours of the rainbow, please.", "Hi"]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in questions]
    batch = Collector(LocalBatch(engine, max_running=4))
    handles = [batch.submit(Request(tuple(p), GenerationParams(temperature=0.0, max_tokens=6)))[0] for p in prompts]
    batch.run()
    assert batch.batch.runner.tally.largest_batch == 3
    assert [batch.tokens(h) for h in handles] == mlx_lm_tokens(folder, prompts, [6] * 3)


def test_replies_that_outgrow_the_kv_budget_preempt_one_another_and_answer_as_alone(folder):
    """Three replies whose caches fit the KV budget side by side until their keys and values grow past 256
    tokens (mlx-lm's cache grows in steps of 256): then one is preempted, waits, reads its ids again (or
    starts from its kept cache) and goes on. Each reply is still mlx-lm's alone."""
    engine = engine_of(folder)
    prompts = [list(range(100 + 50 * s, 140 + 50 * s)) for s in range(3)]
    params = GenerationParams(temperature=0.0, max_tokens=260)
    probe = Collector(LocalBatch(engine))
    kept = probe.submit(Request(tuple(prompts[0]), params.replaced({"max_tokens": 20}), keep_caches=True))[0]
    probe.run()
    short = kept.caches.target.held_bytes  # a sequence under 256 tokens, with its snapshot
    engine = engine_of(folder, max_kv_bytes=int(3.5 * short))  # three short ones fit; three long ones do not
    batch = Collector(LocalBatch(engine, max_running=4))
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    batch.run()
    runner = batch.batch.runner
    assert runner.tally.largest_batch == 3 and runner.tally.preemptions > 0
    assert [batch.tokens(h) for h in handles] == mlx_lm_tokens(folder, prompts, [260] * 3)


def test_a_prompt_the_kv_budget_cannot_hold_is_refused_with_what_bounds_it(folder):
    """With a hybrid model's standard caches the byte budget bounds a chat (its KV beside its linear states and
    a snapshot of them): a longer prompt is refused before any work, naming the budget."""
    from mlxcore.errors import PromptError

    engine = engine_of(folder, max_kv_bytes=2**17)
    room, bound = engine.kv_room()
    assert room == (2**17 - 2 * engine.linear_state_bytes) // engine.kv_token_bytes and "budget" in bound
    with pytest.raises(PromptError, match=f"do not fit in {bound}"):
        list(engine.generate(list(range(10, 10 + room + 1)), engine.new_caches(), GenerationParams(max_tokens=4)))
    tokens = [e.token for e in engine.generate(list(range(10, 40)), engine.new_caches(),
                                               GenerationParams(temperature=0.0, max_tokens=4))
              if isinstance(e, TokenEvent)]
    assert tokens == mlx_lm_tokens(folder, [list(range(10, 40))], [4])[0]
