"""The rotating window cache against a reference: mlx-lm's ``KVCache`` over the whole history + the window as a mask."""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import KVCache

from mlxcore.kv.errors import CacheShapeError, CacheStateError, TrimError
from mlxcore.kv.geometry import KVGeometry
from mlxcore.kv.model_cache import ModelCache, make_model_cache
from mlxcore.kv.rotating import RotatingLayerCache
from mlxcore.kv.window import Window
from tiny_models import tiny_qwen3
from bench.draft_lengths import FixedDraftLength

MODEL = tiny_qwen3(seed=2)
VOCAB = MODEL.args.vocab_size
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


class WindowReference:
    """The whole history in mlx-lm's ``KVCache``; the window rule applied as an explicit mask.

    Query q sees key j iff j <= q and (j < keep or j > q - (max_size - keep)).
    """

    def __init__(self, max_size: int, keep: int) -> None:
        self.kv, self.max_size, self.keep = KVCache(), max_size, keep

    @property
    def offset(self) -> int:
        return self.kv.offset

    def update_and_fetch(self, keys, values):
        return self.kv.update_and_fetch(keys, values)

    def make_mask(self, N, return_array=False, window_size=None):
        q = mx.arange(self.offset, self.offset + N)[:, None]
        j = mx.arange(self.offset + N)[None, :]
        return (j <= q) & ((j < self.keep) | (j > q - (self.max_size - self.keep)))

    def trim(self, n):
        return self.kv.trim(n)


def references(max_size: int, keep: int) -> list[WindowReference]:
    return [WindowReference(max_size, keep) for _ in MODEL.layers]


def feed(cache, ids: list[int]) -> mx.array:
    layers = cache.layers if isinstance(cache, ModelCache) else cache
    if isinstance(cache, ModelCache):
        cache.begin(len(ids))
    logits = MODEL(mx.array([ids]), cache=layers)
    mx.eval(logits)
    return logits


def attend(cache, keys, values, queries) -> mx.array:
    """What attention computes over the cache after appending keys/values (1, kv_heads, N, head_dim)."""
    mask = cache.make_mask(keys.shape[2])
    k, v = cache.update_and_fetch(keys, values)
    return mx.fast.scaled_dot_product_attention(queries, k, v, scale=HEAD_DIM ** -0.5, mask=mask)


geometry = st.tuples(st.integers(4, 24), st.integers(0, 6), st.integers(0, 6)).filter(lambda g: g[1] < g[0])
step = st.one_of(st.tuples(st.just("feed"), st.integers(1, 30)), st.tuples(st.just("trim"), st.integers(1, 10)))


@settings(max_examples=40, deadline=None)
@given(geometry, st.lists(step, min_size=1, max_size=25), st.integers(0, 2**31))
def test_attention_over_random_schedules_matches_the_reference(window, schedule, seed):
    """Random chunk sizes (decode, verify, prefill) and rewinds, before and after wrapping."""
    max_size, keep, max_rewind = window
    rng = np.random.default_rng(seed)
    cache = RotatingLayerCache(KVGeometry(1, KV_HEADS, HEAD_DIM, mx.float32), Window(max_size, keep, max_rewind))
    reference = WindowReference(max_size, keep)
    for name, n in schedule:
        if name == "trim":
            if n > cache.max_trim:
                with pytest.raises(TrimError):
                    cache.trim(n)
                continue
            assert cache.trim(n) == n == reference.trim(n)
            continue
        keys, values, queries = (mx.array(rng.standard_normal(shape).astype(np.float32)) for shape in
                                 ((1, KV_HEADS, n, HEAD_DIM), (1, KV_HEADS, n, HEAD_DIM), (1, HEADS, n, HEAD_DIM)))
        np.testing.assert_allclose(np.array(attend(cache, keys, values, queries)),
                                   np.array(attend(reference, keys, values, queries)), atol=1e-5,
                                   err_msg=f"attention output after feeding {n} at offset {reference.offset - n}")
        assert cache.offset == reference.offset
        if cache.high == cache.offset:  # right after a write: a full rewind is always possible
            assert cache.max_trim >= min(cache.offset, max_rewind)


@settings(max_examples=25, deadline=None)
@given(geometry, st.lists(step, min_size=1, max_size=12))
def test_model_logits_over_random_schedules_match_the_reference(window, schedule):
    max_size, keep, max_rewind = window
    cache = make_model_cache(MODEL, "rotating", max_kv=max_size, keep=keep, max_rewind=max_rewind)
    reference, fed = references(max_size, keep), 0
    for name, n in schedule:
        if name == "trim":
            n = min(n, cache.max_trim)
            assert cache.trim(n) == n
            assert {layer.trim(n) for layer in reference} == {n}
            fed -= n
            continue
        ids = [(fed + i) * 11 % VOCAB for i in range(n)]
        fed += n
        np.testing.assert_allclose(np.array(feed(cache, ids)), np.array(feed(reference, ids)), atol=1e-4,
                                   err_msg=f"logits at offset {fed - n}")
    assert cache.offset == fed


def greedy(cache, prompt: list[int], steps: int) -> list[int]:
    ids, out = prompt, []
    for _ in range(steps):
        ids = [int(mx.argmax(feed(cache, ids)[0, -1]).item())]
        out.append(ids[0])
    return out


def test_greedy_matches_standard_while_the_history_fits():
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, VOCAB, 30)]
    expected = greedy(make_model_cache(MODEL, "standard"), prompt, 60)
    assert greedy(make_model_cache(MODEL, "rotating", max_kv=91, keep=5), prompt, 60) == expected


def test_greedy_past_the_window_matches_the_windowed_reference():
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, VOCAB, 30)]
    expected = greedy(references(40, 6), prompt, 90)
    assert greedy(make_model_cache(MODEL, "rotating", max_kv=40, keep=6, max_rewind=4), prompt, 90) == expected


def test_speculative_style_rewinds_after_wrap_are_exact():
    """Verify k+1 tokens, rewind the rejected ones, repeat: long past the window."""
    cache = make_model_cache(MODEL, "rotating", max_kv=24, keep=4, max_rewind=6)
    reference = references(24, 4)
    rng, history = np.random.default_rng(5), 0
    for _ in range(30):
        k = int(rng.integers(1, 7))
        ids = [int(t) for t in rng.integers(0, VOCAB, k + 1)]
        np.testing.assert_allclose(np.array(feed(cache, ids)), np.array(feed(reference, ids)), atol=1e-4)
        rejected = int(rng.integers(0, k + 1))
        assert cache.trim(rejected) == rejected
        for layer in reference:
            layer.trim(rejected)
        history += k + 1 - rejected
    assert cache.offset == history > 24


def test_a_trim_beyond_the_spare_slots_raises_and_changes_nothing():
    cache = make_model_cache(MODEL, "rotating", max_kv=16, keep=2, max_rewind=3)
    feed(cache, list(range(40)))
    before = (cache.offset, cache.max_trim, [np.array(layer.keys) for layer in cache.layers])
    assert cache.max_trim == 4
    for bad in (5, 41, -1):
        with pytest.raises(TrimError):
            cache.trim(bad)
    assert (cache.offset, cache.max_trim) == before[:2]
    for old, layer in zip(before[2], cache.layers):
        np.testing.assert_array_equal(old, np.array(layer.keys))
    with pytest.raises(CacheShapeError):
        cache.layers[0].update_and_fetch(mx.zeros((1, 3, 1, 16)), mx.zeros((1, 3, 1, 16)))
    assert cache.offset == before[0]


def test_twenty_thousand_tokens_keep_memory_flat_and_trim_exact():
    """Chunks of 500 through a 256-token window; the reference holds all 20,000 tokens under the window mask."""
    model = tiny_qwen3(seed=6, hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16)
    cache = make_model_cache(model, "rotating", max_kv=256, keep=8, max_rewind=16)
    reference = [WindowReference(256, 8)]
    sizes, rng = [], np.random.default_rng(7)
    for start in range(0, 20_000, 500):
        ids = [int(t) for t in rng.integers(0, VOCAB, 500)]
        cache.begin(len(ids))
        got = model(mx.array([ids]), cache=cache.layers)[:, -3:]
        want = model(mx.array([ids]), cache=reference)[:, -3:]
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-4, err_msg=f"chunk at {start}")
        sizes.append(cache.nbytes)
    assert cache.offset == 20_000
    assert set(sizes) == {2 * (256 + 16) * 16 * 4}  # keys + values, slots, head_dim, float32: flat
    for rewind in (16, 3, 9):  # trim after wrap, then decode a few tokens: exact
        assert cache.trim(rewind) == rewind == reference[0].trim(rewind)
        ids = [int(t) for t in rng.integers(0, VOCAB, rewind // 2 + 1)]
        cache.begin(len(ids))
        np.testing.assert_allclose(np.array(model(mx.array([ids]), cache=cache.layers)),
                                   np.array(model(mx.array([ids]), cache=reference)), atol=1e-4)


def test_keep_follows_the_system_prompt_until_the_window_fills():
    cache = make_model_cache(MODEL, "rotating", max_kv=32)
    feed(cache, list(range(10)))
    cache.keep = 10
    assert cache.keep == 10
    feed(cache, list(range(30)))
    with pytest.raises(CacheStateError):
        cache.keep = 4
    reference = references(32, 10)
    feed(reference, list(range(10)) + list(range(30)))
    np.testing.assert_allclose(np.array(feed(cache, [5])), np.array(feed(reference, [5])), atol=1e-4)


def test_wrapped_state_round_trips_exactly():
    cache = make_model_cache(MODEL, "rotating", max_kv=20, keep=3, max_rewind=5)
    feed(cache, list(range(50)))
    cache.trim(4)
    tensors, meta = cache.state_dict(list(range(50)))
    assert meta["tokens"] == list(range(46))
    restored = ModelCache.from_state(MODEL, dict(tensors), meta)
    assert restored.offset == cache.offset and restored.max_trim == cache.max_trim
    for ids in ([7], [1, 2, 3], list(range(30))):
        np.testing.assert_allclose(np.array(feed(restored, ids)), np.array(feed(cache, ids)), atol=0)


def test_a_window_that_cannot_rewind_to_the_next_prompt_is_rebuilt_across_turns():
    """Regression: after a wrapped window was replaced, the engine trimmed it by a negative count."""
    from mlxcore.engine import Engine, KVConfig
    from mlxcore.loading import load_model
    from mlxcore.params import GenerationParams
    from sessions.chat_session import ChatSession

    target, draft = load_model("mini-target"), load_model("mini-draft")
    engine = Engine(target.model, target.tokenizer, kv=KVConfig(kind="rotating", max_kv=48), draft_model=draft.model)
    engine.draft_control = FixedDraftLength(4, max_k=engine.draft_control.max_k)  # every step a round (the adaptive length follows the host's timings), so the
    # draft ends each reply caught up with the target rather than at its next round
    chat = ChatSession(engine, params=GenerationParams(max_tokens=20))  # thinking on: the template then drops
    for text in ("Hi there, how are you today?", "Tell me about cats.", "And dogs?"):  # a think block; the third raised
        assert chat.send(text)
    assert chat.caches.draft.offset == chat.caches.target.offset, "the draft's window was rebuilt and caught up"
