"""What attention reads from a paged table (views, working copies) gives the standard cache's output.

Fresh, forked, rewound and restored tables, and sequences that take blocks in
turn, each decoded step by step next to mlx-lm's ``KVCache`` holding the same
tokens: logits agree to float rounding, and the tokens held agree exactly.
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest

from mlxcore.compiled_forward import CompiledForward
from mlxcore.kv.model_cache import ModelCache, make_block_pool, make_model_cache
from mlxcore.kv.sequence_kv import WORKING_STEP
from tiny_models import tiny_qwen3

MODEL = tiny_qwen3(seed=3)
VOCAB = MODEL.args.vocab_size
ATOL = 1e-4  # float32 logits of a 2-layer model: summation order is the only difference


def ids(count: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, count)]


def step(forward, cache: ModelCache, tokens: list[int]) -> np.ndarray:
    cache.begin(tokens)
    logits = forward(mx.array([tokens]), cache=cache.layers)
    mx.eval(logits)
    return np.array(logits)


def decode_alongside(paged: ModelCache, standard: ModelCache, steps: int, what: str, forward=MODEL) -> None:
    """Greedy decode both caches from their last tokens; every step's logits must agree."""
    assert paged.tokens == standard.tokens, what
    token = paged.tokens[-1]
    for index in range(steps):
        mine, theirs = step(forward, paged, [token]), step(forward, standard, [token])
        np.testing.assert_allclose(mine, theirs, atol=ATOL, err_msg=f"{what}: decode step {index}")
        token = int(theirs[0, -1].argmax())
    assert paged.tokens == standard.tokens, what


def pair(prompt: list[int], pool=None, block_size: int = 16) -> tuple[ModelCache, ModelCache]:
    paged = make_model_cache(MODEL, "paged", pool=pool, block_size=block_size)
    standard = make_model_cache(MODEL, "standard")
    np.testing.assert_allclose(step(MODEL, paged, prompt), step(MODEL, standard, prompt), atol=ATOL)
    return paged, standard


def test_fresh_table_reads_a_view_of_storage():
    paged, standard = pair(ids(300, 0))
    decode_alongside(paged, standard, 40, "fresh")
    assert paged.working_bytes == 0, "a lone sequence's blocks are adjacent: no working copy"
    assert len(paged._gather_index().runs) == 1


def test_fresh_table_through_the_compiled_decode_path():
    forward = CompiledForward(MODEL)
    paged, standard = pair(ids(100, 1))
    decode_alongside(paged, standard, 20, "compiled", forward)


def test_forked_tables_read_working_copies_that_grow_past_their_step():
    """Parent and child both decode after a fork at a partial block: both tables become two runs."""
    paged, standard = pair(ids(WORKING_STEP - 10, 2))
    child, child_standard = paged.fork(), standard.fork()
    decode_alongside(child, child_standard, 30, "child")  # crosses the working copy's first capacity
    decode_alongside(paged, standard, 30, "parent")
    for cache in (paged, child):
        assert len(cache._gather_index().runs) > 1 and cache.working_bytes > 0
    assert paged.pool.manager.block_ids(child.seq_id)[:14] == paged.pool.manager.block_ids(paged.seq_id)[:14]


def test_rewinds_like_speculative_rounds_on_a_forked_table():
    paged, standard = pair(ids(70, 3), block_size=4)
    paged, standard = paged.fork(), standard.fork()  # the parent lives on: its blocks stay shared
    rng = np.random.default_rng(3)
    for round_ in range(25):
        drafted = ids(int(rng.integers(1, 8)), 100 + round_)
        np.testing.assert_allclose(step(MODEL, paged, drafted), step(MODEL, standard, drafted), atol=ATOL,
                                   err_msg=f"verify round {round_}")
        rejected = int(rng.integers(0, len(drafted) + 1))
        assert paged.trim(rejected) == rejected == standard.trim(rejected)
    decode_alongside(paged, standard, 10, "after rewinds")
    assert paged.trim(paged.offset - 30) == standard.trim(standard.offset - 30)  # back into the shared prefix
    decode_alongside(paged, standard, 10, "after a deep rewind")


def test_rewind_past_block_boundaries_on_a_fresh_table_stays_a_view():
    paged, standard = pair(ids(50, 4), block_size=4)
    decode_alongside(paged, standard, 12, "before")
    assert paged.trim(23) == standard.trim(23)
    decode_alongside(paged, standard, 20, "regenerated")
    assert len(paged._gather_index().runs) == 1 and paged.working_bytes == 0


@pytest.mark.parametrize("shared", [False, True])
def test_restored_table_decodes_like_the_standard_cache(shared):
    """A saved sequence restored into a pool; with ``shared``, another sequence holds its prefix there."""
    prompt = ids(200, 5)
    saved, standard = pair(prompt)
    decode_alongside(saved, standard, 5, "before saving")
    tensors, meta = saved.state_dict()
    pool = make_block_pool(MODEL)
    if shared:
        holder = make_model_cache(MODEL, "paged", pool=pool)
        step(MODEL, holder, prompt[:120])
    restored = ModelCache.from_state(MODEL, tensors, meta, pool=pool)
    assert restored.tokens == standard.tokens
    assert pool.stats().prefix_hit_tokens == (112 if shared else 0)
    decode_alongside(restored, standard, 30, "restored")
    assert (len(restored._gather_index().runs) > 1) == shared


def test_sequences_taking_blocks_in_turn_and_a_new_chat_on_a_shared_prompt():
    """Three sequences decode in turns in one pool (many runs each), then one re-prefills a shared prefix."""
    pool = make_block_pool(MODEL, block_size=4)
    pairs = [pair(ids(9 + n, 10 + n), pool=pool, block_size=4) for n in range(3)]
    for round_ in range(6):
        for n, (paged, standard) in enumerate(pairs):
            decode_alongside(paged, standard, 5, f"sequence {n}, round {round_}")
    assert all(len(paged._gather_index().runs) > 4 for paged, _ in pairs)  # the row-gather build path
    history = pairs[0][0].tokens
    fresh = make_model_cache(MODEL, "paged", pool=pool)
    reused = fresh.reuse_prefix(history)
    assert reused > 0
    step(MODEL, fresh, history[reused:])
    decode_alongside(fresh, pairs[0][1], 10, "new chat on a shared history")
    pairs[0][0].release()
    assert pairs[0][0].working_bytes == 0
