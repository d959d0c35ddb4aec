"""Attention over a paged table's runs of blocks (views, no copy) gives mlx-lm's output on its own cache.

Fresh, forked, rewound and restored tables, chats that span several slabs, and
sequences that take blocks in turn: each decodes step by step through our decode
path (rows of the batched pass, ``forward_rows``: attention over the table's segments) next to mlx-lm's
model on its ``KVCache`` holding the same tokens. Logits agree to float
rounding, the tokens held agree exactly, and the pool holds no memory beyond
its slabs.
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest

from mlxcore.batching.batch_forward import BatchDecoder, forward_rows
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.compiled_forward import CompiledForward
from mlxcore.device_profile import current
from mlxcore.kv.model_cache import ModelCache, make_block_pool, make_model_cache
from mlxcore.kv.slab_storage import Gather
from device_profiles import blocked_calls, forward_for, fused_calls, profile, tuned  # noqa: F401
from tiny_models import tiny_qwen3

MODEL = tiny_qwen3(seed=3)
FORWARD = CompiledForward(MODEL)
VOCAB = MODEL.args.vocab_size
ATOL = 1e-4  # float32 logits of a 2-layer model: summation order is the only difference


def ids(count: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, count)]


def step(forward, cache: ModelCache, tokens: list[int], history: list[int] | None = None) -> np.ndarray:
    """One pass; ``history``: the ids the cache holds (its owner's), which ``tokens`` extend and are told."""
    if isinstance(forward, CompiledForward):  # ours: rows of the batched pass
        logits = forward_rows(forward, cache, tokens)[None]
    else:
        cache.begin(len(tokens))
        logits = forward(mx.array([tokens]), cache=cache.layers)
    mx.eval(logits)
    if history is not None:
        history += tokens
        cache.hash_blocks(history)
    return np.array(logits)


def decode_alongside(paged_cache: ModelCache, standard: ModelCache, steps: int, what: str,
                     history: list[int] | None = None) -> None:
    """Greedy decode both caches (ours through the segment path, mlx-lm's model on the standard cache) from the
    last of ``history`` (the ids they hold, extended by those fed), else from token 0; every step's logits
    must agree."""
    assert paged_cache.offset == standard.offset, what
    token = history[-1] if history else 0
    for index in range(steps):
        mine, theirs = step(FORWARD, paged_cache, [token], history), step(MODEL, standard, [token])
        np.testing.assert_allclose(mine, theirs, atol=ATOL, err_msg=f"{what}: decode step {index}")
        token = int(theirs[0, -1].argmax())
    assert paged_cache.offset == standard.offset, what


def pair(prompt: list[int], pool=None, block_size: int = 16) -> tuple[ModelCache, ModelCache]:
    """A paged and a standard cache that read ``prompt`` (the paged one told its ids: prefix hits)."""
    paged_cache = make_model_cache(MODEL, "paged", pool=pool, block_size=block_size)
    standard = make_model_cache(MODEL, "standard")
    np.testing.assert_allclose(step(MODEL, paged_cache, prompt, []), step(MODEL, standard, prompt), atol=ATOL)
    return paged_cache, standard


def runs(cache: ModelCache) -> int:
    return len(cache._gather_index().runs)


def spanned(cache: ModelCache, queries: int = 1) -> bool:
    """Whether attention reads the table's runs as one view over the slots between them (gaps masked)."""
    return cache._span_mask(cache.offset, queries) is not None


def only_slabs(pool) -> bool:
    """The pool's memory is its slabs: MLX's own count of the storage arrays equals the pool's account."""
    return pool.kv_bytes == sum(layer.nbytes for layer in pool.storage) == pool.bytes_allocated


def test_fresh_table_is_one_run():
    paged_cache, standard = pair(ids(300, 0))
    decode_alongside(paged_cache, standard, 40, "fresh")
    assert runs(paged_cache) == 1 and only_slabs(paged_cache.pool)


def test_a_chat_across_slabs_reads_one_view_per_slab():
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8)  # 32 tokens a slab
    paged_cache, standard = pair(ids(70, 1), pool=pool, block_size=4)
    decode_alongside(paged_cache, standard, 40, "across slabs")
    assert runs(paged_cache) == pool.slabs == 4 and only_slabs(pool)


def test_forked_tables_read_their_runs_in_place():
    """Parent and child both decode after a fork at a partial block: both tables become two runs."""
    paged_cache, standard = pair(ids(246, 2))
    child, child_standard = paged_cache.fork(), standard.fork()
    decode_alongside(child, child_standard, 30, "child")
    decode_alongside(paged_cache, standard, 30, "parent")
    assert runs(paged_cache) > 1 and runs(child) > 1 and only_slabs(paged_cache.pool)
    assert spanned(paged_cache) and spanned(child)  # a one-block gap: read as one span
    manager = paged_cache.pool.manager
    assert manager.block_ids(child.seq_id)[:15] == manager.block_ids(paged_cache.seq_id)[:15]


def test_rewinds_like_speculative_rounds_on_a_forked_table():
    paged_cache, standard = pair(ids(70, 3), block_size=4)
    paged_cache, standard = paged_cache.fork(), standard.fork()  # the parent lives on: its blocks stay shared
    step(FORWARD, paged_cache, [1]), step(MODEL, standard, [1])  # copy-on-write: the child's tail is elsewhere
    assert spanned(paged_cache, queries=4)  # verification blocks attend causally over the span
    rng = np.random.default_rng(3)
    for round_ in range(25):
        drafted = ids(int(rng.integers(1, 8)), 100 + round_)
        np.testing.assert_allclose(step(FORWARD, paged_cache, drafted), step(MODEL, standard, drafted), atol=ATOL,
                                   err_msg=f"verify round {round_}")
        rejected = int(rng.integers(0, len(drafted) + 1))
        assert paged_cache.trim(rejected) == rejected == standard.trim(rejected)
    decode_alongside(paged_cache, standard, 10, "after rewinds")
    assert paged_cache.trim(paged_cache.offset - 30) == standard.trim(standard.offset - 30)  # into the shared prefix
    decode_alongside(paged_cache, standard, 10, "after a deep rewind")


def test_rewind_past_block_boundaries_on_a_fresh_table_stays_one_run():
    paged_cache, standard = pair(ids(50, 4), block_size=4)
    decode_alongside(paged_cache, standard, 12, "before")
    assert paged_cache.trim(23) == standard.trim(23)
    decode_alongside(paged_cache, standard, 20, "regenerated")
    assert runs(paged_cache) == 1


@pytest.mark.parametrize("shared", [False, True])
def test_restored_table_decodes_like_the_standard_cache(shared):
    """A saved sequence restored into a pool; with ``shared``, another sequence holds its prefix there."""
    prompt = ids(200, 5)
    saved, standard = pair(prompt)
    history = list(prompt)
    decode_alongside(saved, standard, 5, "before saving", history)
    tensors, meta = saved.state_dict(history)
    pool = make_block_pool(MODEL)
    if shared:
        holder = make_model_cache(MODEL, "paged", pool=pool)
        step(MODEL, holder, prompt[:120], [])
    restored = ModelCache.from_state(MODEL, tensors, meta, pool=pool)
    assert restored.offset == standard.offset == len(history)
    assert pool.stats().prefix_hit_tokens == (112 if shared else 0)
    decode_alongside(restored, standard, 30, "restored")
    assert (runs(restored) > 1) == shared


def test_sequences_taking_blocks_in_turn_and_a_new_chat_on_a_shared_prompt():
    """Three sequences decode in turns in one pool, then one re-prefills a shared prefix."""
    pool = make_block_pool(MODEL, block_size=4)
    histories = [ids(9 + n, 10 + n) for n in range(3)]
    pairs = [pair(list(history), pool=pool, block_size=4) for history in histories]
    for round_ in range(6):
        for n, (paged_cache, standard) in enumerate(pairs):
            decode_alongside(paged_cache, standard, 5, f"sequence {n}, round {round_}", histories[n])
    history = histories[0]
    fresh = make_model_cache(MODEL, "paged", pool=pool)
    reused = fresh.reuse_prefix(history)
    assert reused > 0
    step(MODEL, fresh, history[reused:])
    decode_alongside(fresh, pairs[0][1], 10, "new chat on a shared history", list(history))
    assert only_slabs(pool) and runs(pairs[0][0]) > 3 and spanned(pairs[0][0])  # many small gaps, one span


def test_a_table_of_more_runs_than_attention_takes_is_read_as_one_copy(monkeypatch):
    tuned(monkeypatch, max_segments=2)
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=4)
    paged_cache, standard = pair(ids(40, 6), pool=pool, block_size=4)
    assert runs(paged_cache) == 3
    decode_alongside(paged_cache, standard, 10, "many runs")


def test_a_table_across_slabs_is_read_as_a_view_a_run():
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=4)
    paged_cache, standard = pair(ids(40, 6), pool=pool, block_size=4)
    assert runs(paged_cache) == 3
    decode_alongside(paged_cache, standard, 10, "many runs")
    assert runs(paged_cache) > 3
    keys, _ = paged_cache.layers[0].state  # one array (a session file's read): the runs' views joined
    np.testing.assert_array_equal(np.array(keys), np.array(standard.layers[0].state[0][:, :, :standard.offset]))


def test_a_prompt_chunk_over_a_forked_table_across_slabs(profile, blocked_calls, fused_calls):  # noqa: F811
    """A prompt chunk attends over the runs too: on the CPU in key blocks cut at run boundaries
    (``cpu_attention``), on the GPU through the fused kernel, the runs joined."""
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8)
    paged_cache, standard = pair(ids(50, 7), pool=pool, block_size=4)
    child, child_standard = paged_cache.fork(), standard.fork()
    chunk = ids(400, 8)  # 800 query rows a kv head over 450 keys: more scores than one key block holds
    child_standard.begin(len(chunk))
    blocked_calls.clear(), fused_calls.clear()
    ours = forward_rows(forward_for(MODEL), child, chunk)
    mx.eval(ours)
    layers = len(MODEL.model.layers)
    assert (len(blocked_calls), len(fused_calls)) == ((layers, 0) if profile.kind == "cpu" else (0, layers))
    theirs = MODEL(mx.array([chunk]), cache=child_standard.layers)[0]
    np.testing.assert_allclose(np.array(ours), np.array(theirs), atol=ATOL)
    assert runs(child) > 2
    decode_alongside(child, child_standard, 10, "after prefill")


def test_a_prompt_chunk_in_the_batched_pass_over_a_span_of_runs(profile, blocked_calls, monkeypatch):  # noqa: F811
    """A prompt read alone as rows of the batched pass, over a forked table whose runs lie in one slab with a
    small gap: on the CPU its scores outgrow a key block, so it reads the runs in key blocks (not the span's
    whole score matrix); on the GPU the span, one view with its gap masked, goes to the fused kernel (the runs
    are not joined). The chunk's hidden states and the decode after it are mlx-lm's."""
    fused, keys_read = mx.fast.scaled_dot_product_attention, []
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: keys_read.append((k.shape[2], isinstance(kw.get("mask"), mx.array)))
                        or fused(q, k, v, **kw))
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=256)
    paged_cache, standard = pair(ids(50, 7), pool=pool, block_size=4)
    child, child_standard = paged_cache.fork(), standard.fork()
    chunk, forward = ids(400, 8), forward_for(MODEL)  # 800 query rows a kv head over 450 keys
    feed = PromptFeed(forward, child, chunk)
    slots = child._span_mask(50 + len(chunk), len(chunk))[0][2]
    assert runs(child) > 1 and slots > 50 + len(chunk)  # one slab, a gap between the runs
    child_standard.begin(len(chunk))
    blocked_calls.clear(), keys_read.clear()
    BatchDecoder(forward)([], None, [feed])
    feed.ran()
    layers = len(MODEL.model.layers)
    if profile.kind == "cpu":
        assert len(blocked_calls) == layers and not keys_read
    else:
        assert not blocked_calls and keys_read == [(slots, True)] * layers
    theirs = MODEL.model(mx.array([chunk]), cache=child_standard.layers)
    ours = MODEL.model.norm(feed.h.reshape(1, len(chunk), -1))
    np.testing.assert_allclose(np.array(ours), np.array(theirs), atol=ATOL)
    decode_alongside(child, child_standard, 10, "after the chunk")


def test_span_of_runs_maps_slots_to_positions_and_refuses_wide_gaps_and_other_slabs():
    """``Gather.span``: the slots between a table's runs in one slab, each with its token's position."""
    gather = Gather([0, 1, 3, 2], block_size=4, slab_blocks=8)  # runs: slots 0-7, 12-15, 8-11
    (slab, first, size), positions = gather.span(15)  # the last block holds 3 tokens
    assert (slab, first, size) == (0, 0, 16)
    assert positions.tolist() == list(range(8)) + [12, 13, 14, -1] + [8, 9, 10, 11]
    assert Gather([0, 1, 2], block_size=4, slab_blocks=8).span(12) is None  # one run
    assert Gather([0, 9], block_size=4, slab_blocks=8).span(8) is None  # two slabs
    wide = 1 + current().span_slack_slots // 4
    assert Gather([0, 1 + wide], block_size=4, slab_blocks=64).span(8) is None  # too many slots between


def test_a_span_with_a_wide_gap_reads_runs_and_decodes_like_the_standard_cache(monkeypatch):
    tuned(monkeypatch, span_slack_slots=0)
    paged_cache, standard = pair(ids(246, 2))
    child, child_standard = paged_cache.fork(), standard.fork()
    decode_alongside(child, child_standard, 20, "child, runs")
    assert runs(child) > 1 and not spanned(child)
