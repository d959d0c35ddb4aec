"""The batch's mirror of the pool (``batch_mirror.py``): what a batch reads stays the pool's tokens while
sequences join, leave, change order and are changed outside the batch; its bytes are the budget's."""

from __future__ import annotations

import weakref

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest

from mlxcore.batching import batch_mirror
from mlxcore.batching.batch_forward import BatchDecoder
from mlxcore.compiled_forward import CompiledForward
from mlxcore.device_profile import current
from mlxcore.kv.budget import KVBudget
from mlxcore.kv.model_cache import make_block_pool, make_model_cache
from mlxcore.prefill import prefill
from device_profiles import forward_for, profile, tuned  # noqa: F401
from tiny_models import tiny_qwen3

MODEL = tiny_qwen3(seed=33, layers=2, heads=4, kv_heads=2)
FORWARD = CompiledForward(MODEL)
HELD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache -> the ids it holds (its owner's record)


def prompt(stream: int, length: int) -> list[int]:
    return [(stream * 131 + i * 7919) % 383 + 1 for i in range(length)]


def reference(tokens: list[int]) -> np.ndarray:
    """Next-token logits after ``tokens``, from mlx-lm's model over the whole sequence (no cache)."""
    return np.array(MODEL(mx.array([tokens]))[0, -1])


def step(decoder: BatchDecoder, caches: list, tokens: list[int]) -> None:
    """One batched step feeding ``tokens``; each row's logits must be the reference's after that token."""
    logits = np.array(decoder(caches, mx.array(tokens)))
    for row, (cache, token) in enumerate(zip(caches, tokens)):
        HELD[cache].append(token)
        np.testing.assert_allclose(logits[row], reference(HELD[cache]), atol=2e-4, rtol=1e-4,
                                   err_msg=f"row {row} of a batch of {len(caches)}")


def new_cache(pool, stream: int, length: int):
    cache = make_model_cache(MODEL, "paged", pool=pool, block_size=4)
    HELD[cache] = []
    read(cache, prompt(stream, length))
    return cache


def read(cache, ids: list[int]) -> None:
    """More tokens read into ``cache`` on its own, outside the batch."""
    prefill(forward_for(MODEL), cache, ids, 64)
    HELD[cache] += ids


@pytest.mark.parametrize("alone_cost", [current().alone_cost_keys, 0])
def test_rows_follow_joins_leaves_reorders_and_outside_changes(monkeypatch, alone_cost, profile):  # noqa: F811
    """alone_cost 0: the longest rows are attended on their own, not in the padded block."""
    tuned(monkeypatch, alone_cost_keys=alone_cost)
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8)
    a, b, c = new_cache(pool, 0, 9), new_cache(pool, 1, 21), new_cache(pool, 2, 4)
    decoder = BatchDecoder(forward_for(MODEL))
    for i in range(3):
        step(decoder, [a, b, c], [5 + i, 6 + i, 7 + i])
    assert decoder.mirror.bytes > 0, "the batch read its tokens from the mirror"
    step(decoder, [a, b], [8, 9])  # fewer sequences than the mirror has rows, in its first rows
    a.trim(3)  # a rewind outside the batch, then new tokens at the same positions
    del HELD[a][-3:]
    step(decoder, [c, a], [11, 12])  # b left; order changed
    read(b, prompt(9, 5))  # b read more tokens on its own
    d = b.fork()  # a new cache sharing b's blocks
    HELD[d] = list(HELD[b])
    step(decoder, [b, d, a, c], [13, 14, 15, 16])
    c.release()
    e = new_cache(pool, 4, 30)
    for i in range(2):
        step(decoder, [e, d, b], [17 + i, 18 + i, 19 + i])


def test_a_row_changed_outside_the_batch_is_copied_again_only_from_the_change(monkeypatch, profile):  # noqa: F811
    """A speculative round's rows (tokens read outside the batch, then some rewound) are copied into the
    row, not the whole sequence again; a rewind alone copies nothing. Each row still reads the pool's tokens."""
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8)
    a, b = new_cache(pool, 0, 13), new_cache(pool, 1, 22)
    decoder = BatchDecoder(forward_for(MODEL))
    step(decoder, [a, b], [5, 6])
    plan, copied = decoder.mirror.plan, []

    def recording(caches):
        made = plan(caches)
        copied.append([(caches.index(cache), start, cache.offset) for cache, start, _ in made.fills])
        return made
    monkeypatch.setattr(decoder.mirror, "plan", recording)
    read(a, prompt(3, 5))  # a round's five rows...
    a.trim(2)  # ...of which three are kept
    del HELD[a][-2:]
    step(decoder, [a, b], [7, 8])
    b.trim(1)
    del HELD[b][-1:]
    step(decoder, [a, b], [9, 10])
    assert copied == [[(0, 14, 17)], []]


def test_the_mirror_grows_past_its_first_capacity(monkeypatch):
    monkeypatch.setattr(batch_mirror, "CAPACITY_STEP", 8)
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8)
    caches = [new_cache(pool, s, 5 + 3 * s) for s in range(3)]
    decoder = BatchDecoder(FORWARD)
    for i in range(12):
        step(decoder, caches, [20 + i, 21 + i, 22 + i])
    assert decoder.mirror.capacity >= max(cache.offset for cache in caches)


def test_sequences_joining_one_a_step_keep_its_capacity(monkeypatch):
    """A row more is not a longer row: twenty sequences joining one a step (each a prefix hit, as clients
    sending one schema's requests at once are) leave the capacity at what the longest needs. Before, each
    join doubled it: 2^20 times the tokens, and the server was killed for its memory."""
    monkeypatch.setattr(batch_mirror, "CAPACITY_STEP", 8)
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8)
    decoder, caches = BatchDecoder(FORWARD), []
    for s in range(12):
        caches.append(new_cache(pool, s, 6))
        step(decoder, caches, [30 + s] * len(caches))
    longest = max(cache.offset for cache in caches)
    assert decoder.mirror.capacity <= 2 * max(longest, 8), decoder.mirror.capacity


def test_its_bytes_are_the_budgets_and_a_full_budget_takes_them_back(monkeypatch):
    """A budget that the pool fills: the mirror's bytes count in it, the pool's next block takes them back,
    and the batch goes on reading the pool."""
    monkeypatch.setattr(batch_mirror, "CAPACITY_STEP", 8)
    geometry = make_block_pool(MODEL, block_size=4).geometry
    budget = KVBudget(geometry.token_bytes * 4 * 8 * 3)  # three slabs of 8 blocks of 4 tokens
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8, budget=budget)
    caches = [new_cache(pool, s, 10) for s in range(2)]
    decoder = BatchDecoder(FORWARD)
    step(decoder, caches, [1, 2])
    held = decoder.mirror.bytes
    assert held > 0
    assert budget.in_use == pool.bytes_allocated + held
    others = [new_cache(pool, 5 + s, 22) for s in range(2)]  # the pool needs the mirror's room
    assert budget.in_use == pool.bytes_allocated == budget.limit, "the pool took the mirror's room"
    for i in range(3):
        step(decoder, caches + others, [3 + i, 4 + i, 5 + i, 6 + i])
    assert budget.in_use <= budget.limit
    assert budget.in_use == pool.bytes_allocated + (decoder.mirror.bytes if decoder.mirror else 0)
    decoder.release()
    assert budget.in_use == pool.bytes_allocated, "release gives every byte of the mirror back"


def test_the_mirror_holds_as_much_as_the_budget_or_the_pool(monkeypatch, profile):  # noqa: F811
    """No limit of its own: a batch is mirrored while the budget (with none, the pool's size) has room, and
    each row reads the pool beyond it."""
    monkeypatch.setattr(batch_mirror, "CAPACITY_STEP", 8)
    token_bytes = make_block_pool(MODEL, block_size=4).geometry.token_bytes
    for max_blocks, mirrored in ((64, True), (6, False)):  # two rows of 16 tokens: 32 tokens' bytes
        pool = make_block_pool(MODEL, block_size=4, slab_blocks=8, max_blocks=max_blocks)
        caches = [new_cache(pool, s, 10) for s in range(2)]
        decoder = BatchDecoder(forward_for(MODEL))
        step(decoder, caches, [1, 2])
        assert (decoder.mirror.bytes > 0) == mirrored, (max_blocks, decoder.mirror.bytes)
        assert decoder.mirror.bytes <= max_blocks * 4 * token_bytes


def test_long_rows_go_alone_when_padding_to_them_costs_more():
    assert batch_mirror._alone([100, 90, 2000, 80]) == [2]
    assert batch_mirror._alone([100, 90, 120, 80]) == []
    assert batch_mirror._alone([3000, 60, 2900, 50, 40, 40, 40, 40]) == [0, 2]


def test_more_rows_of_fewer_tokens_when_the_limit_allows_no_more(monkeypatch):
    """The mirror's room (the pool's size, without a budget) takes 3 rows of 32 tokens or 4 of 16: a long sequence leaves the batch and two
    short ones join, so the storage is made again with shorter rows (every row filled from the pool)."""
    monkeypatch.setattr(batch_mirror, "CAPACITY_STEP", 8)
    tuned(monkeypatch, alone_cost_keys=1 << 20)
    token_bytes = 2 * 2 * 16 * 4 * 2  # keys and values, 2 kv heads x 16, float32, 2 layers
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8, max_blocks=24)  # room for 3 rows of 32 tokens
    long, b, c = new_cache(pool, 0, 30), new_cache(pool, 1, 5), new_cache(pool, 2, 6)
    decoder = BatchDecoder(FORWARD)
    step(decoder, [long, b, c], [1, 2, 3])
    assert decoder.mirror.capacity == 32
    d, e = new_cache(pool, 3, 7), new_cache(pool, 4, 4)
    for i in range(3):
        step(decoder, [b, c, d, e], [4 + i, 5 + i, 6 + i, 7 + i])
    assert decoder.mirror.capacity == 16 and decoder.mirror.bytes == 4 * 16 * token_bytes


def test_each_pass_starts_the_pools_writes_it_does_not_read(monkeypatch):
    """Reading the mirror, a pass does not depend on the pool's writes: they are handed to MLX in the
    pass all the same (left lazy, they piled up into one slow step whenever something read the pool)."""
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8)
    caches = [new_cache(pool, s, 6 + 5 * s) for s in range(3)]
    decoder = BatchDecoder(FORWARD)
    started = []
    real = mx.async_eval

    def recording(*arrays):
        started.extend(id(a) for group in arrays for a in (group if isinstance(group, list) else [group]))
        return real(*arrays)

    monkeypatch.setattr(mx, "async_eval", recording)
    for i in range(2):
        step(decoder, caches, [1 + i, 2 + i, 3 + i])
    assert decoder.mirror.bytes > 0
    blocks = [pool.manager.block_ids(cache.seq_id)[(cache.offset - 1) // 4] for cache in caches]
    written = {block // 8 for block in blocks}  # the slabs of 8 blocks the last tokens went to
    for storage in pool.storage:
        for slab in written:
            assert all(id(part) in started for part in storage.slabs[slab])
