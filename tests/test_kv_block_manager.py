"""The paged cache's tensor-free bookkeeping: allocation, prefix hits, copy-on-write, eviction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kv.block_manager import BlockManager, chain_hash
from mlxcore.kv.errors import CacheStateError, PoolExhaustedError, TrimError, UnknownSequenceError


def filled(manager: BlockManager, ids: list[int]) -> int:
    seq = manager.new_sequence()
    manager.append(seq, ids)
    return seq


def check_invariants(manager: BlockManager) -> None:
    """Ref counts equal table references; free blocks are exactly those unreferenced; hashes agree."""
    refs = [0] * manager.materialized_blocks
    for seq in manager._sequences.values():
        assert len(seq.block_ids) == -(-seq.length // manager.block_size)
        assert len(seq.token_ids) <= seq.length
        for block_id in seq.block_ids:
            refs[block_id] += 1
    for block in manager._blocks:
        assert block.ref_count == refs[block.block_id], f"block {block.block_id} ref count"
        assert (block.block_id in manager._free) == (block.ref_count == 0)
    for digest, block_id in manager._by_hash.items():
        assert manager._blocks[block_id].hash == digest, "hash entry points at a block with another hash"
    for seq in manager._sequences.values():  # every full block of a table carries its chain hash
        parent = None
        for index in range(len(seq.token_ids) // manager.block_size):
            chunk = seq.token_ids[index * manager.block_size:(index + 1) * manager.block_size]
            parent = chain_hash(parent, chunk)
            assert manager._blocks[seq.block_ids[index]].hash == parent
        if len(seq.token_ids) < seq.length:  # a block holding a token whose id is not known is no prefix hit
            for index in range(len(seq.token_ids) // manager.block_size, len(seq.block_ids)):
                assert manager._blocks[seq.block_ids[index]].hash is None


def test_blocks_are_taken_as_tokens_arrive_and_slots_follow_the_table():
    manager = BlockManager(block_size=4, num_blocks=8)
    seq = manager.new_sequence()
    plan = manager.append(seq, [1, 2, 3])
    assert (plan.start, plan.length, plan.copies) == (0, 3, ())
    assert [(s.slot, s.length, s.source) for s in plan.segments] == [(0, 3, 0)]
    plan = manager.append(seq, [4, 5, 6, 7, 8, 9, 10])
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


def test_shared_partial_tail_is_copied_before_a_write():
    manager = BlockManager(block_size=4, num_blocks=8)
    parent = filled(manager, [1, 2, 3, 4, 5, 6])
    child = manager.fork(parent)
    plan = manager.append(child, [7])
    tail = manager.block_ids(parent)[1]
    assert plan.copies == ((tail, manager.block_ids(child)[1]),)
    assert plan.segments[0].slot == manager.block_ids(child)[1] * 4 + 2
    assert manager.append(parent, [8]).copies == ()  # the parent owns its tail alone now
    check_invariants(manager)


def test_trim_releases_blocks_past_the_boundary():
    manager = BlockManager(block_size=4, num_blocks=8)
    seq = filled(manager, list(range(10)))
    manager.trim(seq, 2)
    assert len(manager.block_ids(seq)) == 2
    manager.trim(seq, 1)
    assert len(manager.block_ids(seq)) == 2 and manager.token_ids(seq) == list(range(7))
    manager.append(seq, [70])  # rewrites the tail in place: its old hash goes
    other = manager.new_sequence()
    assert manager.reuse_prefix(other, list(range(9))) == 4
    check_invariants(manager)


def test_tokens_fed_before_they_are_read_are_hashed_once_told():
    """A pass queued before its input was read appends slots without ids; ``known`` tells them, and only then
    does the block they fill become a prefix hit (no placeholder id is ever hashed)."""
    manager = BlockManager(block_size=4, num_blocks=8)
    seq = filled(manager, [1, 2, 3])
    plan = manager.append(seq, [], unknown=1)
    assert (plan.start, plan.length, manager.length(seq), manager.token_ids(seq)) == (3, 1, 4, [1, 2, 3])
    assert manager.cached_prefix([1, 2, 3, 4, 5]) == (0, 0)  # the full block's last id is not known
    with pytest.raises(CacheStateError, match="not known yet"):
        manager.append(seq, [9])  # an id after an unknown one
    manager.known(seq, [4])
    assert manager.token_ids(seq) == [1, 2, 3, 4]
    assert manager.cached_prefix([1, 2, 3, 4, 5]) == (4, 0)
    with pytest.raises(CacheStateError):
        manager.known(seq, [5])  # nothing left unknown
    manager.append(seq, [5], unknown=3)  # a speculative pass: the last known id, then k drafted ones
    manager.known(seq, [6, 7])
    manager.trim(seq, 1)  # the rejected draft: gone unread
    assert (manager.length(seq), manager.token_ids(seq)) == (7, [1, 2, 3, 4, 5, 6, 7])
    manager.append(seq, [], unknown=2)
    manager.trim(seq, 2)
    assert (manager.length(seq), manager.token_ids(seq)) == (7, [1, 2, 3, 4, 5, 6, 7])
    check_invariants(manager)


def test_errors_change_nothing():
    manager = BlockManager(block_size=4, num_blocks=2)
    seq = filled(manager, list(range(6)))
    before = (list(manager.block_ids(seq)), list(manager.token_ids(seq)), manager.stats())
    with pytest.raises(PoolExhaustedError):
        manager.append(seq, list(range(3)))
    with pytest.raises(TrimError):
        manager.trim(seq, 7)
    with pytest.raises(CacheStateError):
        manager.reuse_prefix(seq, list(range(9)))
    assert (manager.block_ids(seq), manager.token_ids(seq), manager.stats()) == before
    with pytest.raises(UnknownSequenceError):
        manager.append(99, [1])
    manager.drop_sequence(seq)
    with pytest.raises(UnknownSequenceError):
        manager.token_ids(seq)


operation = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=9)),
    st.tuples(st.just("trim"), st.integers(0, 3), st.integers(0, 9)),
    st.tuples(st.just("fork"), st.integers(0, 3), st.none()),
    st.tuples(st.just("release"), st.integers(0, 3), st.none()),
    st.tuples(st.just("reuse"), st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
    st.tuples(st.just("unknown"), st.integers(0, 3), st.integers(1, 5)),
    st.tuples(st.just("known"), st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=5)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(operation, max_size=40))
def test_random_schedules_keep_the_books_straight(schedule):
    manager = BlockManager(block_size=3, num_blocks=12)
    seqs = [manager.new_sequence()]
    for name, which, arg in schedule:
        seq = seqs[which % len(seqs)]
        tokens, told = manager.length(seq), len(manager.token_ids(seq))
        try:
            if name == "append" and told < tokens:
                with pytest.raises(CacheStateError):
                    manager.append(seq, arg)
            elif name == "append":
                manager.append(seq, arg)
                assert manager.token_ids(seq)[-len(arg):] == arg
            elif name == "trim":
                manager.trim(seq, min(arg, tokens))
            elif name == "fork" and told < tokens:
                with pytest.raises(CacheStateError):
                    manager.fork(seq)
            elif name == "fork":
                seqs.append(manager.fork(seq))
            elif name == "release":
                manager.release(seq)
            elif name == "unknown":
                manager.append(seq, [], unknown=arg)
                assert (manager.length(seq), len(manager.token_ids(seq))) == (tokens + arg, told)
            elif name == "known":
                manager.known(seq, arg[:tokens - told])
                assert manager.token_ids(seq)[told:] == arg[:tokens - told]
            elif not tokens:
                assert manager.reuse_prefix(seq, arg) < len(arg)
                assert manager.token_ids(seq) == arg[:len(manager.token_ids(seq))]
        except PoolExhaustedError:
            assert manager.length(seq) == tokens
        except CacheStateError:
            assert name == "known" and told == tokens  # nothing was unknown
            assert manager.length(seq) == tokens
        check_invariants(manager)
