"""The ``ModelCache`` API on every kind: passes, forks, trims, prefix hits, state round trips, bench rows."""

from __future__ import annotations

import time

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from bench import kv_measure as measure
from mlxcore.kv.errors import CacheShapeError, CacheStateError, TrimError
from mlxcore.kv.model_cache import KINDS, ModelCache, make_block_pool, make_model_cache
from mlxcore.kv.protocol import LayerCache
from tiny_models import tiny_qwen3

MODEL = tiny_qwen3(seed=3)
OPTIONS = {"standard": {}, "paged": {"block_size": 4}, "rotating": {"max_kv": 64, "keep": 4}}


def make(kind: str) -> ModelCache:
    return make_model_cache(MODEL, kind, **OPTIONS[kind])


def feed(cache: ModelCache, ids: list[int]) -> mx.array:
    cache.begin(len(ids))
    logits = MODEL(mx.array([ids]), cache=cache.layers)
    mx.eval(logits)
    return logits


@pytest.mark.parametrize("kind", KINDS)
def test_layers_follow_the_protocol_and_a_pass_is_announced_by_its_count(kind):
    """``begin`` takes how many tokens the pass feeds (a decoder may not have read them yet): never their ids."""
    cache = make(kind)
    assert all(isinstance(layer, LayerCache) for layer in cache.layers)
    feed(cache, [5, 6, 7])
    feed(cache, [8])
    assert cache.offset == 4
    cache.begin(2)  # never fed: dropped by the next begin
    assert cache.offset == 4
    picked = mx.argmax(feed(cache, [9])[0, -1])  # a lazy pick, fed before anyone reads it
    cache.begin(1)
    logits = MODEL(picked.reshape(1, 1), cache=cache.layers)
    reference = feed(make(kind), [5, 6, 7, 8, 9, picked.item()])
    assert cache.offset == 6
    np.testing.assert_allclose(np.array(logits), np.array(reference)[:, -1:], atol=1e-4)
    assert cache.trim(2) == 2 and cache.offset == 4
    with pytest.raises(ValueError):
        cache.begin(0)


def test_paged_blocks_are_prefix_hits_once_told_and_held_by_every_layer():
    """The ids come from the owner (``hash_blocks``), once every layer holds the tokens: before that another
    sequence finds none of the blocks (it would read keys and values not written yet)."""
    pool = make_block_pool(MODEL, block_size=4)
    cache, other = (make_model_cache(MODEL, "paged", pool=pool) for _ in range(2))
    ids = list(range(10))
    feed(cache, ids[:6])
    cache.begin(4)  # a pass stopped after its first layer, or a chunk a few layers a step
    g = cache.geometry
    kv = mx.zeros((1, g.kv_heads, 4, g.head_dim), g.dtype)
    cache.layers[0].update_and_fetch(kv, kv)
    cache.hash_blocks(ids)
    assert other.reuse_prefix(ids + [1]) == 4  # the second block is not in every layer yet
    other.release()
    cache.settle()
    feed(cache, ids[6:])
    assert other.reuse_prefix(ids + [1]) == 4  # held, not told
    other.release()
    cache.hash_blocks(ids + [77, 78])  # ids past what it holds are ignored
    assert other.reuse_prefix(ids + [1]) == 8
    reference = make("standard")
    np.testing.assert_allclose(np.array(feed(other, ids[8:] + [1])), np.array(feed(reference, ids + [1]))[:, -3:],
                               atol=1e-4)
    cache.release(ids)  # what it held stays cached, told at the end
    assert pool.manager.cached_prefix(ids + [1]) == (8, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_hold_leaves_a_prefix_of_the_ids(kind):
    """A pass fed a token past the reply's end (``prefill.hold``, as an abandoned or ended reply)."""
    from mlxcore.prefill import hold
    cache = make(kind)
    feed(cache, [5, 6, 7])
    feed(cache, [8])
    hold(cache, [5, 6, 7, 8, 9])
    assert cache.offset == 4
    hold(cache, [5, 6, 7])
    assert cache.offset == 3
    np.testing.assert_allclose(np.array(feed(cache, [9])), np.array(feed(make(kind), [5, 6, 7, 9]))[:, -1:],
                               atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_forks_are_independent(kind):
    parent = make(kind)
    feed(parent, list(range(10)))
    child = parent.fork()
    assert child.offset == parent.offset == 10
    child_logits = feed(child, [3, 4, 5])
    parent.trim(2)
    parent_logits = feed(parent, [3, 4, 5])
    assert (child.offset, parent.offset) == (13, 11)
    cold = make(kind)
    np.testing.assert_allclose(np.array(feed(cold, list(range(10)) + [3, 4, 5]))[:, -3:],
                               np.array(child_logits), atol=1e-4)
    assert not np.allclose(np.array(parent_logits), np.array(child_logits))


@pytest.mark.parametrize("kind", KINDS)
def test_state_round_trips(kind):
    cache = make(kind)
    feed(cache, list(range(23)))
    cache.trim(3)
    with pytest.raises(CacheStateError):
        cache.state_dict(list(range(19)))  # fewer ids than it holds
    tensors, meta = cache.state_dict(list(range(23)))  # the owner's ids may run on past what it holds
    assert meta["kind"] == kind and meta["tokens"] == list(range(20))
    restored = ModelCache.from_state(MODEL, dict(tensors), meta)
    assert restored.offset == 20
    np.testing.assert_allclose(np.array(feed(restored, [40, 41])), np.array(feed(cache, [40, 41])), atol=1e-5)
    empty = ModelCache.from_state(MODEL, *make(kind).state_dict([]))
    assert empty.offset == 0


def test_paged_state_holds_only_its_sequence_and_restores_into_a_shared_pool():
    pool = make_block_pool(MODEL, block_size=4)
    other, cache = make_model_cache(MODEL, "paged", pool=pool), make_model_cache(MODEL, "paged", pool=pool)
    feed(other, list(range(100)))
    other.hash_blocks(list(range(100)))
    feed(cache, list(range(9)))
    tensors, meta = cache.state_dict(list(range(9)))
    assert {array.shape[2] for array in tensors.values()} == {9}
    used = pool.stats().used_blocks
    restored = ModelCache.from_state(MODEL, tensors, meta, pool=pool)
    assert pool.stats().used_blocks == used + 1  # two full blocks shared with `other`, one new
    reference = make_model_cache(MODEL, "standard")
    feed(reference, list(range(9)))
    np.testing.assert_allclose(np.array(feed(restored, [1])), np.array(feed(reference, [1])), atol=1e-5)


def test_bad_states_are_typed_errors():
    cache = make("standard")
    feed(cache, list(range(5)))
    tensors, meta = cache.state_dict(list(range(5)))
    with pytest.raises(CacheStateError):
        ModelCache.from_state(MODEL, tensors, {**meta, "kind": "quantum"})
    with pytest.raises(CacheStateError):
        ModelCache.from_state(MODEL, {}, meta)
    with pytest.raises(CacheShapeError):
        ModelCache.from_state(MODEL, {k: v[:, :1] for k, v in tensors.items()}, meta)
    paged_meta = {**meta, "kind": "paged"}
    with pytest.raises(CacheStateError):
        ModelCache.from_state(MODEL, {k: v[..., :3, :] for k, v in tensors.items()}, paged_meta)


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_trims_raise_and_change_nothing(kind):
    cache = make(kind)
    feed(cache, list(range(6)))
    for bad in (-1, 7):
        with pytest.raises(TrimError):
            cache.trim(bad)
    assert cache.offset == 6
    with pytest.raises(CacheStateError):
        cache.reuse_prefix(list(range(10)))


def test_reuse_prefix_finds_nothing_on_unshared_kinds():
    for kind in ("standard", "rotating"):
        assert make(kind).reuse_prefix(list(range(50))) == 0


def test_standard_is_mlx_lm_kvcache():
    layers = make("standard").layers
    assert all(isinstance(layer, KVCache) for layer in layers)
    assert all(type(layer).update_and_fetch is KVCache.update_and_fetch for layer in layers)


def test_bench_rows():
    overhead = measure.paged_kv_overhead(MODEL, tokens=1000, block_size=16)
    assert overhead["key"] == "paged_kv_overhead" and 1 <= overhead["value"] <= overhead["bound"]
    branches = measure.branch_memory(MODEL, prefix=1000, suffix=50, branches=4)
    assert branches["paged_bytes"] <= branches["bound_bytes"]
    assert branches["value"] < 0.5  # four standard copies of the prefix versus one shared
    start = time.perf_counter()
    speed = measure.paged_decode_vs_standard(MODEL, prompt_tokens=64, steps=8, rounds=1)
    elapsed = time.perf_counter() - start
    assert (speed["key"], speed["prompt_tokens"]) == ("paged_decode_vs_standard", 64)
    assert speed["value"] == pytest.approx(speed["paged_tok_s"] / speed["standard_tok_s"], rel=1e-12)
    # 8 steps on each kind, one after the other, inside the call: their times add up to less than it took
    assert 0 < 8 / speed["paged_tok_s"] + 8 / speed["standard_tok_s"] < elapsed


@pytest.mark.parametrize("kind", KINDS)
def test_a_forward_pass_stopped_half_way_is_rewound(kind):
    cache = make(kind)
    feed(cache, list(range(6)))
    cache.begin(2)
    g = cache.geometry
    kv = mx.zeros((1, g.kv_heads, 2, g.head_dim), g.dtype)
    cache.layers[0].update_and_fetch(kv, kv)  # the pass stops after its first layer
    logits = feed(cache, [7])
    assert cache.offset == 7
    np.testing.assert_allclose(np.array(logits), np.array(feed(make(kind), list(range(6)) + [7]))[:, -1:],
                               atol=1e-4)
