"""The paged cache against mlx-lm's ``KVCache``: contents, logits, greedy output, sharing, errors.

Greedy tokens are compared for equality: on the CPU backend both caches feed the same products the same rows (see
docs/internals.md, "What is exact on which device"; on Metal a near-tie could flip).
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import KVCache

from mlxcore.kv.errors import CacheShapeError, CacheStateError, PoolExhaustedError, TrimError
from mlxcore.kv.model_cache import ModelCache, make_block_pool, make_model_cache
from tiny_models import tiny_qwen3

MODEL = tiny_qwen3(seed=1)
VOCAB = MODEL.args.vocab_size


def feed(model, cache: ModelCache, ids: list[int], owner: list[int] | None = None) -> mx.array:
    """One forward pass over ``ids``; returns logits (1, len(ids), vocab). ``owner``: the ids the cache held
    (its owner's, as ``Caches.ids``), which ``ids`` then extend and which are told to it (prefix hits)."""
    start = cache.offset
    cache.begin(len(ids))
    logits = model(mx.array([ids]), cache=cache.layers)
    mx.eval(logits)
    if owner is not None:
        owner[start:] = ids
        cache.hash_blocks(owner)
    return logits


def greedy(model, cache: ModelCache, prompt: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens; on an empty cache from the prompt's cached blocks, the ids told as they come."""
    owner = None
    if not cache.offset:
        reused = cache.reuse_prefix(prompt)
        ids, owner = prompt[reused:], prompt[:reused]
    else:
        ids = prompt
    out = []
    for _ in range(steps):
        ids = [int(mx.argmax(feed(model, cache, ids, owner)[0, -1]).item())]
        out.append(ids[0])
    return out


def assert_same_contents(cache: ModelCache, reference: ModelCache, what: str) -> None:
    assert cache.offset == reference.offset, what
    if not cache.offset:
        return
    for index, (mine, theirs) in enumerate(zip(cache.layers, reference.layers)):
        keys, values = mine.state
        np.testing.assert_allclose(np.array(keys), np.array(theirs.keys[..., :theirs.offset, :]),
                                   atol=1e-4, err_msg=f"{what}: keys of layer {index}")
        np.testing.assert_allclose(np.array(values), np.array(theirs.values[..., :theirs.offset, :]),
                                   atol=1e-4, err_msg=f"{what}: values of layer {index}")


step = st.one_of(
    st.tuples(st.just("feed"), st.lists(st.integers(0, 5), min_size=1, max_size=9)),
    st.tuples(st.just("trim"), st.integers(1, 12)),
    st.tuples(st.just("fork"), st.none()),
    st.tuples(st.just("switch"), st.none()),
    st.tuples(st.just("reprefill"), st.none()),
)


@settings(max_examples=30, deadline=None)
@given(st.lists(step, min_size=1, max_size=14), st.sampled_from([1, 3, 4]))
def test_random_schedules_match_mlx_lm_kvcache(schedule, block_size):
    """Feed/trim/fork/re-prefill at random: logits and cache contents equal the standard cache's."""
    pool = make_block_pool(MODEL, block_size=block_size, max_blocks=128)
    live = [(make_model_cache(MODEL, "paged", pool=pool), make_model_cache(MODEL, "standard"), [])]
    current = 0
    for name, arg in schedule:
        paged, standard, history = live[current]  # history: the ids the paged cache's owner keeps
        if name == "feed":
            ids = [t * 7 % VOCAB for t in arg]  # few distinct tokens: prefixes repeat, blocks get shared
            np.testing.assert_allclose(np.array(feed(MODEL, paged, ids, history)),
                                       np.array(feed(MODEL, standard, ids)), atol=1e-4, err_msg="logits")
        elif name == "trim":
            n = min(arg, paged.offset)
            assert paged.trim(n) == n == standard.trim(n)
            del history[paged.offset:]
        elif name == "fork":
            live.append((paged.fork(), standard.fork(), list(history)))
        elif name == "switch":
            current = (current + 1) % len(live)
        elif paged.offset > 1:  # a new sequence with this history: shares blocks, prefills the rest
            fresh = make_model_cache(MODEL, "paged", pool=pool)
            reused = fresh.reuse_prefix(history)
            assert reused < len(history) and reused % block_size == 0
            feed(MODEL, fresh, history[reused:], history[:reused])
            live[current] = (fresh, standard, history)
        assert_same_contents(*live[current][:2], f"after {name}")


def test_greedy_generation_matches_standard_token_for_token():
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, 37)]
    expected = greedy(MODEL, make_model_cache(MODEL, "standard"), prompt, 40)
    assert greedy(MODEL, make_model_cache(MODEL, "paged", block_size=8), prompt, 40) == expected
    pool = make_block_pool(MODEL, block_size=8)
    first = make_model_cache(MODEL, "paged", pool=pool)
    greedy(MODEL, first, prompt, 5)
    reusing = make_model_cache(MODEL, "paged", pool=pool)  # regenerate: the prompt's full blocks are hits
    assert greedy(MODEL, reusing, prompt, 40) == expected
    assert pool.stats().prefix_hit_tokens == 32


def test_a_regenerated_reply_after_trim_matches_a_cold_run():
    prompt = list(range(5, 30))
    cache = make_model_cache(MODEL, "paged", block_size=4)
    first = greedy(MODEL, cache, prompt, 12)
    assert cache.trim(11) == 11 and cache.offset == len(prompt)  # the 12th token was never fed
    cache.trim(1)
    assert greedy(MODEL, cache, prompt[-1:], 12) == first


def test_branches_of_a_long_prefix_share_its_blocks():
    """N branches (half forks, half new sequences hitting the prefix) of a 1,000-token prefix."""
    block_size, prefix, suffix, branches = 16, 1000, 40, 4
    pool = make_block_pool(MODEL, block_size=block_size)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB, prefix)]
    root = make_model_cache(MODEL, "paged", pool=pool)
    feed(MODEL, root, ids, [])
    children = []
    for branch in range(branches):
        own = [int(t) for t in np.random.default_rng(branch).integers(0, VOCAB, suffix)]
        child = root.fork() if branch % 2 else make_model_cache(MODEL, "paged", pool=pool)
        history = ids + own
        feed(MODEL, child, history[child.offset + child.reuse_prefix(history) if not child.offset else prefix:])
        assert child.offset == len(history)
        children.append(child)
    token_bytes = pool.geometry.token_bytes
    bound = (prefix + branches * (suffix + block_size)) * token_bytes
    held = pool.stats().used_blocks * pool.block_bytes  # shared blocks counted once
    assert held <= bound, (held, bound)
    assert pool.stats().prefix_hit_tokens == branches // 2 * (prefix // block_size) * block_size


def test_overhead_is_at_most_one_block():
    for tokens in (1, 15, 16, 17, 333):
        cache = make_model_cache(MODEL, "paged", block_size=16)
        feed(MODEL, cache, list(range(tokens)))
        held = tokens * cache.pool.geometry.token_bytes
        assert cache.nbytes / held <= 1 + 16 / tokens
        assert cache.pool.stats().used_blocks * cache.pool.block_bytes == cache.nbytes


def test_storage_grows_lazily_and_release_returns_blocks():
    pool = make_block_pool(MODEL, block_size=16, max_blocks=10_000)
    cache = make_model_cache(MODEL, "paged", pool=pool)
    feed(MODEL, cache, list(range(40)))
    assert pool.bytes_allocated <= pool.config.slab_blocks * pool.block_bytes  # one slab, not 10,000 blocks
    cache.release()
    assert cache.offset == 0 and pool.stats().used_blocks == 0
    feed(MODEL, cache, [1, 2, 3])  # usable again after release
    assert cache.offset == 3


def snapshot(cache: ModelCache):
    stats = cache.pool.stats()  # blocks handed out and given back meanwhile may leave storage larger
    held = (stats.used_blocks, stats.cached_blocks, cache.pool.manager.block_ids(cache.seq_id))
    return cache.offset, held, [np.array(layer.state[0]) for layer in cache.layers]


def assert_unchanged(cache: ModelCache, before) -> None:
    after = snapshot(cache)
    assert after[:2] == before[:2]
    for old, new in zip(before[2], after[2]):
        np.testing.assert_array_equal(old, new)


def test_pool_exhaustion_is_typed_and_changes_nothing():
    cache = make_model_cache(MODEL, "paged", block_size=4, max_kv=12)
    feed(MODEL, cache, list(range(10)))
    before = snapshot(cache)
    with pytest.raises(PoolExhaustedError):
        cache.begin(3)
    assert_unchanged(cache, before)
    feed(MODEL, cache, [1, 2])  # still usable: exactly fills the pool
    assert cache.offset == 12


def test_wrong_shapes_are_typed_and_undo_the_begin():
    cache = make_model_cache(MODEL, "paged", block_size=4)
    feed(MODEL, cache, list(range(6)))
    before = snapshot(cache)
    cache.begin(3)
    with pytest.raises(CacheShapeError):
        MODEL(mx.array([[1, 2]]), cache=cache.layers)  # two tokens where begin announced three
    assert_unchanged(cache, before)
    keys = mx.zeros((1, 3, 1, 16))  # wrong number of KV heads
    cache.begin(1)
    with pytest.raises(CacheShapeError):
        cache.layers[0].update_and_fetch(keys, keys)
    assert_unchanged(cache, before)


def test_invalid_trims_and_missing_begin_are_typed():
    cache = make_model_cache(MODEL, "paged", block_size=4)
    feed(MODEL, cache, list(range(6)))
    before = snapshot(cache)
    for bad in (7, -1):
        with pytest.raises(TrimError):
            cache.trim(bad)
    assert_unchanged(cache, before)
    with pytest.raises(CacheStateError):
        MODEL(mx.array([[1]]), cache=cache.layers)
    assert_unchanged(cache, before)


def test_a_begin_without_forward_pass_is_dropped():
    cache = make_model_cache(MODEL, "paged", block_size=4)
    feed(MODEL, cache, list(range(6)))
    cache.begin(3)
    assert cache.offset == 6
    feed(MODEL, cache, [7])
    assert cache.offset == cache.pool.manager.length(cache.seq_id) == 7


def test_layer_caches_follow_the_protocol_and_mlx_lm_trim():
    from mlx_lm.models.cache import trim_prompt_cache

    from mlxcore.kv.protocol import LayerCache

    cache = make_model_cache(MODEL, "paged", block_size=4)
    assert all(isinstance(layer, LayerCache) for layer in cache.layers)
    feed(MODEL, cache, list(range(10)))
    assert trim_prompt_cache(cache.layers, 5) == 5
    assert cache.offset == 5 and len(cache.pool.manager.block_ids(cache.seq_id)) == 2
    reference = KVCache()
    reference.update_and_fetch(*cache.layers[0].state)
    assert cache.layers[0].state[0].shape == reference.keys[..., :5, :].shape


@pytest.mark.parametrize("sequences", [2, 3])
def test_interleaved_sequences_read_back_through_every_gather_path(sequences):
    """Sequences that take blocks in turn: one run, then a few (slices), then many (row gather)."""
    pool = make_block_pool(MODEL, block_size=4)
    caches = [make_model_cache(MODEL, "paged", pool=pool) for _ in range(sequences)]
    references = [make_model_cache(MODEL, "standard") for _ in range(sequences)]
    for round_ in range(8):
        for index, (cache, reference) in enumerate(zip(caches, references)):
            ids = [(round_ * 5 + index * 3 + i) % VOCAB for i in range(4 if round_ < 7 else 3)]
            np.testing.assert_allclose(np.array(feed(MODEL, cache, ids)), np.array(feed(MODEL, reference, ids)),
                                       atol=1e-4, err_msg=f"round {round_}, sequence {index}")
            assert_same_contents(cache, reference, f"round {round_}")
    assert len(caches[0]._gather_index().runs) == 8
    cache, reference = caches[0], references[0].layers[1]
    for start in (0, 3, 4, 13, cache.offset - 1, cache.offset):  # a sequence's tail, as the batch's mirror takes it
        keys, values = cache.tokens(1, start)
        np.testing.assert_allclose(np.array(keys), np.array(reference.keys[..., start:reference.offset, :]), atol=1e-4)
        np.testing.assert_allclose(np.array(values), np.array(reference.values[..., start:reference.offset, :]), atol=1e-4)
