"""The paged cache's tensor-free bookkeeping: allocation, prefix hits, copy-on-write, eviction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kv.block_manager import BlockManager, chain_hash
from mlxcore.kv.errors import CacheStateError, PoolExhaustedError, TrimError, UnknownSequenceError


def filled(manager: BlockManager, ids: list[int]) -> int:
    """A new sequence holding ``ids``, told (its full blocks hashed), as a paged cache's owner leaves it."""
    seq = manager.new_sequence()
    manager.append(seq, len(ids))
    manager.hash_blocks(seq, ids)
    return seq


def check_invariants(manager: BlockManager, owners: dict[int, tuple[list[int], int]] | None = None) -> None:
    """Ref counts equal table references; free blocks are exactly those unreferenced; hashes agree. ``owners``:
    seq -> (the ids its owner gave it, how many of them it told): told full blocks carry their chain hash,
    and a full block that carries one holds what it says (a block another owner never told is no hit)."""
    refs = [0] * manager.materialized_blocks
    for seq in manager._sequences.values():
        assert len(seq.block_ids) == -(-seq.length // manager.block_size)
        for block_id in seq.block_ids:
            refs[block_id] += 1
    for block in manager._blocks:
        assert block.ref_count == refs[block.block_id], f"block {block.block_id} ref count"
        assert (block.block_id in manager._free) == (block.ref_count == 0)
    for digest, block_id in manager._by_hash.items():
        assert manager._blocks[block_id].hash == digest, "hash entry points at a block with another hash"
    for seq_id, (ids, told) in (owners or {}).items():
        size, table = manager.block_size, manager.block_ids(seq_id)
        assert len(ids) == manager.length(seq_id)
        parent = None
        for index in range(len(ids) // size):
            parent = chain_hash(parent, ids[index * size:(index + 1) * size])
            found = manager._blocks[table[index]].hash
            assert found == parent if index < told // size else found in (None, parent), f"block {index}"


def test_blocks_are_taken_as_tokens_arrive_and_slots_follow_the_table():
    manager = BlockManager(block_size=4, num_blocks=8)
    seq = manager.new_sequence()
    plan = manager.append(seq, 3)
    assert (plan.start, plan.length, plan.copies) == (0, 3, ())
    assert [(s.slot, s.length, s.source) for s in plan.segments] == [(0, 3, 0)]
    plan = manager.append(seq, 7)
    assert [(s.slot, s.length, s.source) for s in plan.segments] == [(3, 1, 0), (4, 4, 1), (8, 2, 5)]
    assert manager.block_ids(seq) == [0, 1, 2]
    assert manager.stats().used_blocks == 3
    check_invariants(manager)


def test_prefix_hit_shares_full_blocks_and_always_leaves_a_token():
    manager = BlockManager(block_size=4, num_blocks=16)
    first = filled(manager, list(range(12)))
    second = manager.new_sequence()
    assert manager.reuse_prefix(second, list(range(12))) == 8  # not 12: the model computes >= 1 token
    assert manager.block_ids(second) == manager.block_ids(first)[:2]
    assert manager.ref_count(manager.block_ids(first)[0]) == 2
    third = manager.new_sequence()
    assert manager.reuse_prefix(third, list(range(13))) == 12
    assert manager.stats().prefix_hit_tokens == 20
    check_invariants(manager)


def test_prefix_hit_stops_at_the_first_differing_block():
    manager = BlockManager(block_size=4, num_blocks=16)
    filled(manager, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    other = manager.new_sequence()
    assert manager.reuse_prefix(other, [1, 2, 3, 4, 5, 6, 0, 8, 9, 10]) == 4
    chained = manager.new_sequence()  # same second block, different first: the chain hash differs
    assert manager.reuse_prefix(chained, [0, 2, 3, 4, 5, 6, 7, 8, 9]) == 0


def test_freed_blocks_keep_their_hash_and_revive_on_a_hit():
    manager = BlockManager(block_size=4, num_blocks=16)
    seq = filled(manager, list(range(10)))
    blocks = list(manager.block_ids(seq))
    manager.release(seq)
    assert manager.stats().used_blocks == 0 and manager.stats().cached_blocks == 2
    again = manager.new_sequence()
    assert manager.reuse_prefix(again, list(range(10))) == 8
    assert manager.block_ids(again) == blocks[:2]
    manager.release(again)
    third = manager.new_sequence()  # revived-then-freed blocks still hit: the hash survived
    assert manager.reuse_prefix(third, list(range(10))) == 8
    check_invariants(manager)


def test_reused_block_drops_only_its_own_hash_entry():
    manager = BlockManager(block_size=2, num_blocks=3)
    first = filled(manager, [1, 2])  # block 0 hashed
    manager.release(first)
    second = filled(manager, [1, 2, 3])  # fresh blocks 1, 2; block 1 now owns the hash of [1, 2]
    assert manager.block_ids(second) == [1, 2]
    third = filled(manager, [7])  # evicts block 0, whose hash entry now points elsewhere
    assert manager.block_ids(third) == [0]
    fourth = manager.new_sequence()
    manager.release(third)
    assert manager.reuse_prefix(fourth, [1, 2, 9]) == 2, "stale hash removal broke the live entry"
    check_invariants(manager)


def test_unhashed_blocks_are_reused_first_then_fresh_ones_then_oldest_cached_tail_first():
    manager = BlockManager(block_size=2, num_blocks=6)
    cached = filled(manager, [1, 2, 3, 4])  # blocks 0, 1 (full, hashed)
    partial = filled(manager, [9])  # block 2 (partial)
    manager.release(cached)
    manager.release(partial)
    order = [manager.block_ids(filled(manager, [50 + i]))[0] for i in range(5)]
    assert order == [2, 3, 4, 5, 1]  # partial first, fresh next, then the cached tail before its head
    check_invariants(manager)


def test_a_growing_sequence_never_takes_the_cached_head_of_another_prompt():
    """The block right after a sequence's last is taken when it continues the same prefix (the sequence's own
    old tail), not when it starts another prompt's chain. Before: an agent's main request, extending its
    cached prefix, took the head of its memory request's cached prompt, and the rest of that chain could
    never be hit again."""
    manager = BlockManager(block_size=4, num_blocks=16)
    a, b = list(range(100, 104)), list(range(200, 212))
    first, second = filled(manager, a), filled(manager, b)  # a: block 0; b: blocks 1-3
    manager.release(second)
    manager.release(first)
    grows = manager.new_sequence()
    assert manager.reuse_prefix(grows, a + [7, 8]) == 4
    manager.append(grows, 6)  # a block after block 0
    assert manager.block_ids(grows)[1] != 1, "b's first block stays cached"
    other = manager.new_sequence()
    assert manager.reuse_prefix(other, b + [9]) == 12
    check_invariants(manager)


def test_a_regenerated_tail_takes_its_old_blocks_and_stays_adjacent():
    manager = BlockManager(block_size=4, num_blocks=16)
    a = list(range(100, 104))
    manager.release(filled(manager, a + [7, 8, 9, 10]))  # blocks 0 (a), 1 (its continuation)
    again = manager.new_sequence()
    assert manager.reuse_prefix(again, a + [5, 6]) == 4
    manager.append(again, 2)
    assert manager.block_ids(again) == [0, 1]
    check_invariants(manager)


def test_shared_partial_tail_is_copied_before_a_write():
    manager = BlockManager(block_size=4, num_blocks=8)
    parent = filled(manager, [1, 2, 3, 4, 5, 6])
    child = manager.fork(parent)
    plan = manager.append(child, 1)
    tail = manager.block_ids(parent)[1]
    assert plan.copies == ((tail, manager.block_ids(child)[1]),)
    assert plan.segments[0].slot == manager.block_ids(child)[1] * 4 + 2
    assert manager.append(parent, 1).copies == ()  # the parent owns its tail alone now
    check_invariants(manager)


def test_trim_releases_blocks_past_the_boundary():
    manager = BlockManager(block_size=4, num_blocks=8)
    seq = filled(manager, list(range(10)))
    manager.trim(seq, 2)
    assert len(manager.block_ids(seq)) == 2
    manager.trim(seq, 1)
    assert len(manager.block_ids(seq)) == 2 and manager.length(seq) == 7
    manager.append(seq, 1)  # rewrites the tail in place: its old hash goes
    other = manager.new_sequence()
    assert manager.reuse_prefix(other, list(range(9))) == 4
    check_invariants(manager, {seq: ([*range(7), 70], 4)})


def test_a_block_is_a_prefix_hit_only_once_its_owner_tells_its_ids():
    """Slots are taken by count; the ids come from the sequence's owner when it knows them (a decode pass is
    queued before its input is read; a prompt chunk is written over several passes). No id is guessed."""
    manager = BlockManager(block_size=4, num_blocks=8)
    seq = filled(manager, [1, 2, 3])
    plan = manager.append(seq, 1)
    assert (plan.start, plan.length, manager.length(seq)) == (3, 1, 4)
    assert manager.cached_prefix([1, 2, 3, 4, 5]) == (0, 0)  # the full block's last id is not told
    manager.hash_blocks(seq, [1, 2, 3, 4], held=3)  # told, but the last is not written in every layer yet
    assert manager.cached_prefix([1, 2, 3, 4, 5]) == (0, 0)
    manager.hash_blocks(seq, [1, 2, 3, 4, 99])  # more ids than it holds: the rest are ignored
    assert manager.cached_prefix([1, 2, 3, 4, 5]) == (4, 0)
    manager.append(seq, 4)  # a speculative pass: the last token, then three drafted ones
    manager.trim(seq, 1)  # the rejected draft: gone before anyone told its id
    manager.hash_blocks(seq, [1, 2, 3, 4, 5, 6, 7, 8])
    assert manager.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8]) == (4, 0)  # 7 held: the second block is not full
    manager.append(seq, 1)
    manager.hash_blocks(seq, [1, 2, 3, 4, 5, 6, 7, 80])
    assert manager.cached_prefix([1, 2, 3, 4, 5, 6, 7, 80, 9]) == (8, 0)
    check_invariants(manager, {seq: ([1, 2, 3, 4, 5, 6, 7, 80], 8)})


def test_errors_change_nothing():
    manager = BlockManager(block_size=4, num_blocks=2)
    seq = filled(manager, list(range(6)))
    before = (list(manager.block_ids(seq)), manager.length(seq), manager.stats())
    with pytest.raises(PoolExhaustedError):
        manager.append(seq, 3)
    with pytest.raises(TrimError):
        manager.trim(seq, 7)
    with pytest.raises(CacheStateError):
        manager.reuse_prefix(seq, list(range(9)))
    assert (manager.block_ids(seq), manager.length(seq), manager.stats()) == before
    with pytest.raises(UnknownSequenceError):
        manager.append(99, 1)
    manager.drop_sequence(seq)
    with pytest.raises(UnknownSequenceError):
        manager.length(seq)


operation = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=9)),
    st.tuples(st.just("trim"), st.integers(0, 3), st.integers(0, 9)),
    st.tuples(st.just("fork"), st.integers(0, 3), st.none()),
    st.tuples(st.just("release"), st.integers(0, 3), st.none()),
    st.tuples(st.just("reuse"), st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
    st.tuples(st.just("tell"), st.integers(0, 3), st.integers(0, 14)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(operation, max_size=40))
def test_random_schedules_keep_the_books_straight(schedule):
    """Each sequence's owner keeps its ids and tells some of them now and then, as the runner does."""
    manager = BlockManager(block_size=3, num_blocks=12)
    owners = {manager.new_sequence(): ([], 0)}
    for name, which, arg in schedule:
        seq = list(owners)[which % len(owners)]
        ids, told = owners[seq]
        tokens = manager.length(seq)
        try:
            if name == "append":
                manager.append(seq, len(arg))
                owners[seq] = (ids + arg, told)
            elif name == "trim":
                manager.trim(seq, min(arg, tokens))
                owners[seq] = (ids[:tokens - min(arg, tokens)], min(told, tokens - min(arg, tokens)))
            elif name == "fork":
                owners[manager.fork(seq)] = (list(ids), told)
            elif name == "release":
                manager.release(seq)
                owners[seq] = ([], 0)
            elif name == "tell":
                manager.hash_blocks(seq, ids, held=arg)
                owners[seq] = (ids, max(told, min(arg, tokens)))
            elif not tokens:
                reused = manager.reuse_prefix(seq, arg)
                assert reused < len(arg) and manager.length(seq) == reused
                owners[seq] = (arg[:reused], reused)
        except PoolExhaustedError:
            assert manager.length(seq) == tokens
        check_invariants(manager, owners)
