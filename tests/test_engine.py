"""Engine.generate against mlx-lm's own generation: same greedy tokens, same cache contents."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.engine import Engine, KVConfig
from mlxcore.errors import PromptError
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.params import GenerationParams
from tiny_models import tiny_qwen3
from device_profiles import profile  # noqa: F401


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(seed=3, vocab_size=512, layers=2, hidden=64)


def mlx_lm_tokens(model, prompt, n):
    """Greedy tokens and the final per-layer caches from mlx-lm's generate_step."""
    cache = make_prompt_cache(model)
    tokens = [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=cache)]
    return tokens, cache


def our_tokens(engine, prompt, n, cache=None, **params):
    cache = cache or engine.new_caches()
    events = list(engine.generate(prompt, cache, GenerationParams(max_tokens=n, **params)))
    return [e.token for e in events if isinstance(e, TokenEvent)], cache, events


def random_prompt(seed, length, vocab=512):
    return np.random.default_rng(seed).integers(0, vocab, length).tolist()


@pytest.mark.parametrize("length,n,chunk", [(1, 5, 512), (7, 40, 512), (100, 60, 16), (300, 20, 64)])
def test_greedy_tokens_and_cache_equal_mlx_lm(model, length, n, chunk):
    engine = Engine(model, None, kv=KVConfig(kind="standard"))
    prompt = random_prompt(length, length)
    ref_tokens, ref_cache = mlx_lm_tokens(model, prompt, n)
    tokens, cache, _ = our_tokens(engine, prompt, n, prefill_chunk=chunk)
    assert tokens == ref_tokens
    assert cache.offset == len(prompt) + n == ref_cache[0].offset
    assert cache.tokens == prompt + tokens
    for i, (ours, ref) in enumerate(zip(cache.target.layers, ref_cache)):
        for name, a, b in zip(("keys", "values"), ours.state, ref.state):
            np.testing.assert_allclose(np.array(a[..., : cache.offset, :]), np.array(b[..., : cache.offset, :]),
                                       atol=1e-5, err_msg=f"layer {i} {name} differ")


@pytest.mark.parametrize("kind", ["paged", "standard", "rotating"])
@pytest.mark.parametrize("length,chunk", [(100, 16), (300, 128)])
def test_a_prompt_read_alone_rides_the_batched_pass(model, profile, kind, length, chunk, monkeypatch):
    """With nothing else decoding, a prompt is read as rows of the batched pass, alone, one prefill chunk a
    pass, uncompiled (no kernels built per chunk length), on the pool or on a cache of one sequence (a lone
    reply's rotating or standard one), not by ``prefill()``: the same driver as a prompt joining running
    replies; the decode steps are one compiled row each. Tokens and cache contents are mlx-lm's (a window larger than
    the reply)."""
    import mlxcore.batching.runner as runner
    monkeypatch.setattr(runner, "prefill", lambda *args: pytest.fail("prefill() read the prompt"))
    engine = Engine(model, None, kv=KVConfig(kind=kind, max_kv=512 if kind == "rotating" else None))
    layer, rows, compiled = engine.target_forward._layers[0], [], []
    monkeypatch.setattr(layer, "before_rows", lambda h, at, real=layer.before_rows: rows.append(h.shape[0]) or real(h, at))
    monkeypatch.setattr(layer, "before_batch", lambda h, at, real=layer.before_batch: compiled.append(h.shape[0]) or real(h, at))
    prompt = random_prompt(length, length)
    ref_tokens, ref_cache = mlx_lm_tokens(model, prompt, 12)
    tokens, cache, _ = our_tokens(engine, prompt, 12, prefill_chunk=chunk)
    assert tokens == ref_tokens
    read = len(prompt) - 1  # the prompt's last token is the first decode step's input
    assert rows == [chunk] * (read // chunk) + ([read % chunk] if read % chunk else [])
    assert set(compiled) == {1} and len(compiled) >= 12  # each decode step: one row (one more queued ahead)
    assert cache.tokens == prompt + tokens
    for i, (ours, ref) in enumerate(zip(cache.target.layers, ref_cache)):
        for name, a, b in zip(("keys", "values"), ours.state, ref.state):
            np.testing.assert_allclose(np.array(a[..., : cache.offset, :]), np.array(b[..., : cache.offset, :]),
                                       atol=1e-5, err_msg=f"layer {i} {name} differ")


@pytest.mark.parametrize("own_chunk", [None, 16])
def test_a_paged_prompt_read_alone_takes_the_steps_budget_a_pass(model, own_chunk, monkeypatch):
    """Served with nothing else decoding, a prompt goes through the batched pass as many tokens a pass as the
    step's token budget gives it (a request's own ``prefill_chunk`` at most); its reply is mlx-lm's."""
    engine = Engine(model, None, kv=KVConfig(kind="paged"))
    layer, rows = engine.target_forward._layers[0], []
    monkeypatch.setattr(layer, "before_rows", lambda h, at, real=layer.before_rows: rows.append(h.shape[0]) or real(h, at))
    prompt = random_prompt(8, 300)
    batch = LocalBatch(engine, max_running=2, step_tokens=200)  # over the CPU's prefill chunk (128)
    handle = batch.submit(Request(tuple(prompt), GenerationParams(max_tokens=6, prefill_chunk=own_chunk)))[0]
    batch.run_until(handle.finished.is_set)
    tokens = [e.token for e in drain(handle) if isinstance(e, TokenEvent)]
    assert tokens == mlx_lm_tokens(model, prompt, 6)[0]
    assert rows == ([200, 99] if own_chunk is None else [16] * 18 + [11])


def test_events_end_with_final_stats(model):
    engine = Engine(model, None, kv=KVConfig(kind="standard"))
    tokens, _, events = our_tokens(engine, random_prompt(1, 30), 12)
    assert isinstance(events[-1], FinalEvent) and events[-1].finish_reason == "length"
    assert events[-2].finish_reason == "length" and all(e.finish_reason is None for e in events[:-2])
    stats = events[-1].stats
    assert (stats.prompt_tokens, stats.prefill_tokens, stats.generated_tokens) == (30, 30, 12)
    assert all(np.isfinite(e.logprob) and e.logprob <= 0 for e in events[:-1])


def test_stopping_early_leaves_cache_exact(model):
    engine = Engine(model, None, kv=KVConfig(kind="standard"))
    prompt = random_prompt(2, 20)
    cache = engine.new_caches()
    seen = []
    for event in engine.generate(prompt, cache, GenerationParams(max_tokens=50)):
        if isinstance(event, FinalEvent):
            break
        seen.append(event.token)
        assert cache.offset == len(prompt) + len(seen)
        if len(seen) == 7:
            break
    assert cache.tokens == prompt + seen


def test_a_reply_stopped_after_its_last_token_keeps_its_figures(model):
    """The last token and the final event come out of one step; a caller that stops between them still
    finds the reply's figures (as stopped) in ``last_stats``."""
    engine = Engine(model, None, kv=KVConfig(kind="standard"))
    events = engine.generate(random_prompt(3, 20), engine.new_caches(), GenerationParams(max_tokens=4))
    tokens = [next(events) for _ in range(4)]
    events.close()
    assert all(isinstance(e, TokenEvent) for e in tokens)
    assert engine.last_stats is not None and engine.last_stats.finish_reason == "stopped"
    assert engine.last_stats.generated_tokens == 4


@pytest.mark.parametrize("kind", ["paged", "standard", "rotating"])
def test_caches_the_caller_made_decode_as_mlx_lm_and_stop_exactly(model, kind):
    """A paged engine given caches it did not make (a paged cache in a pool of its own, a standard or rotating
    one), as the bench rows do: the same greedy tokens as mlx-lm's, stopped part way and stepped in turn
    with another reply's generator, each cache left holding exactly what its caller took."""
    from mlxcore.caches import Caches
    from mlxcore.kv.model_cache import make_model_cache
    engine = Engine(model, None, kv=KVConfig(kind="paged"))
    prompts = [random_prompt(10, 30), random_prompt(11, 25)]
    options = {"rotating": {"max_kv": 256}}.get(kind, {})
    caches = [Caches(make_model_cache(model, kind, **options)) for _ in prompts]
    streams = [engine.generate(p, c, GenerationParams(max_tokens=40)) for p, c in zip(prompts, caches)]
    taken: list[list[int]] = [[], []]
    for _ in range(12):  # in turns, as bench/paged_decode.py steps its two caches
        for stream, seen in zip(streams, taken):
            seen.append(next(e for e in stream if isinstance(e, TokenEvent)).token)
    for stream in streams:
        stream.close()
    for prompt, seen, cache in zip(prompts, taken, caches):
        assert seen == mlx_lm_tokens(model, prompt, 12)[0]
        assert cache.tokens == prompt + seen


@pytest.mark.parametrize("kind", ["paged", "standard"])
def test_caches_the_caller_restored_with_their_ids_keep_their_prefix(model, kind):
    """A cache restored from its saved state (as bench/paged_decode.py makes them) and given the ids it holds
    is a prefix the next turn reads nothing of again, and answers as a cold run; without its ids a turn on it is
    refused (it would match no prompt, and the whole prompt would be read again without a word)."""
    from mlxcore.caches import Caches
    from mlxcore.kv.base import ModelCache
    from mlxcore.kv.errors import CacheStateError
    from mlxcore.kv.model_cache import make_block_pool
    engine = Engine(model, None, kv=KVConfig(kind="paged"))
    prompt = random_prompt(12, 40)
    first, made, _ = our_tokens(engine, prompt, 8)
    tensors, meta = made.target.state_dict(made.ids)
    pool = make_block_pool(model) if kind == "paged" else None
    restored = ModelCache.from_state(model, tensors, dict(meta, kind=kind), pool=pool)
    held = made.ids[:restored.offset]
    assert restored.offset == len(prompt) + len(first)  # a finished reply's caches hold its last token too
    with pytest.raises(CacheStateError, match=f"holding {len(held)} tokens was given 0 ids"):
        list(engine.generate(held + [1], Caches(restored), GenerationParams(max_tokens=2)))
    assert restored.offset == len(held), "refused before any change"
    follow = held + random_prompt(13, 9)
    second, _, events = our_tokens(engine, follow, 10, cache=Caches(restored, ids=list(held)))
    assert events[-1].stats.reused_tokens == len(held)
    assert second == mlx_lm_tokens(model, follow, 10)[0]


def test_next_turn_reuses_the_cached_prefix(model):
    engine = Engine(model, None, kv=KVConfig(kind="standard"))
    prompt = random_prompt(4, 40)
    first, cache, _ = our_tokens(engine, prompt, 10)
    follow = prompt + first + random_prompt(5, 9)
    second, cache, events = our_tokens(engine, follow, 10, cache=cache)
    assert events[-1].stats.reused_tokens == len(prompt) + len(first)
    assert second == mlx_lm_tokens(model, follow, 10)[0]  # equal to a cold run


def test_eos_ends_the_reply(model):
    engine = Engine(model, None, kv=KVConfig(kind="standard"))
    prompt = random_prompt(6, 10)
    tokens = mlx_lm_tokens(model, prompt, 8)[0]
    engine.eos_ids = {tokens[3]}
    ours, cache, events = our_tokens(engine, prompt, 8)
    assert ours == tokens[: tokens.index(tokens[3]) + 1]
    assert events[-1].finish_reason == "eos" and cache.offset == len(prompt) + len(ours)


@pytest.mark.parametrize("kind", ["standard", "paged"])
def test_with_ignore_eos_the_reply_runs_past_eos_to_max_tokens(model, kind):
    engine = Engine(model, None, kv=KVConfig(kind=kind))
    prompt = random_prompt(6, 10)
    tokens = mlx_lm_tokens(model, prompt, 8)[0]
    engine.eos_ids = {tokens[3]}
    ours, _, events = our_tokens(engine, prompt, 8, ignore_eos=True)
    assert ours == tokens and events[-1].finish_reason == "length"


def test_seeded_sampling_is_reproducible(model):
    engine = Engine(model, None, kv=KVConfig(kind="standard"))
    prompt = random_prompt(7, 10)
    a = our_tokens(engine, prompt, 30, temperature=1.0, seed=11)[0]
    b = our_tokens(engine, prompt, 30, temperature=1.0, seed=11)[0]
    c = our_tokens(engine, prompt, 30, temperature=1.0, seed=12)[0]
    assert a == b and a != c


def test_empty_and_too_long_prompts_are_prompt_errors(model):
    engine = Engine(model, None, kv=KVConfig(kind="standard"), context_length=64)
    with pytest.raises(PromptError, match="empty"):
        next(engine.generate([], engine.new_caches()))
    with pytest.raises(PromptError, match="context"):
        next(engine.generate(list(range(64)), engine.new_caches()))


@pytest.fixture(scope="module")
def embedded():
    from mlxcore.loading import load_model
    return load_model("mini-target")


@pytest.mark.parametrize("question,thinking,n", [("What is 12 + 7?", True, 80), ("Reverse the word stone.", False, 40),
                                                 ("Sort 9, 2, 5.", True, 120), ("Hello!", False, 8)])
def test_embedded_target_matches_mlx_lm_stream_generate(embedded, question, thinking, n):
    """Tokens and final cache contents equal mlx_lm.stream_generate's on the shipped model and template."""
    from mlx_lm import stream_generate

    from mlxcore.chat_template import render_chat
    ids = render_chat(embedded.tokenizer, [{"role": "user", "content": question}], enable_thinking=thinking)
    ref_cache = make_prompt_cache(embedded.model)
    ref = [r.token for r in stream_generate(embedded.model, embedded.tokenizer, ids, max_tokens=n,
                                            prompt_cache=ref_cache)]
    for kind in ("standard", "paged"):
        engine = Engine(embedded.model, embedded.tokenizer, kv=KVConfig(kind=kind))
        tokens, cache, events = our_tokens(engine, ids, n)
        assert tokens == ref, kind
        assert cache.offset == ref_cache[0].offset == len(ids) + len(tokens)
        for i, (ours, theirs) in enumerate(zip(cache.target.layers, ref_cache)):
            for name, a, b in zip(("keys", "values"), ours.state, theirs.state):
                np.testing.assert_allclose(np.array(a[..., : cache.offset, :]), np.array(b[..., : cache.offset, :]),
                                           atol=1e-4, err_msg=f"{kind}: layer {i} {name} differ")
