"""The pieces of the distributed run that work out answers without other ranks: which models split over how
many ranks, which heads a rank keeps, and what one process does with the sharing helpers."""

from __future__ import annotations

import time

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import pytest

from mlxcore.distributed.broadcast import every_rank, leader_number, share
from mlxcore.distributed.errors import ShardingError, is_lost_peer, lost_peer
from mlxcore.distributed.kv_shards import KVShards
from mlxcore.distributed.shard_check import check_shardable
from mlxcore.distributed.world import SINGLE, World
from mlxcore.kv.geometry import KVGeometry
from mlxcore import seeds
from tiny_models import tiny_config, tiny_moe_config

QWEN3_8B_4BIT = {"model_type": "qwen3", "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                 "head_dim": 128, "intermediate_size": 12288, "quantization": {"group_size": 64, "bits": 4}}


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_qwen3_8b_splits_over_its_kv_head_divisors(ranks):
    check_shardable(QWEN3_8B_4BIT, ranks, "Qwen3-8B-4bit")


def test_kv_heads_that_do_not_divide_are_named():
    with pytest.raises(ShardingError, match=r"has 8 KV heads, which 3 ranks cannot share evenly.*\(e\.g\. 2\)"):
        check_shardable(QWEN3_8B_4BIT, 3, "Qwen3-8B-4bit")
    with pytest.raises(ShardingError, match="8 KV heads, which 16 ranks"):
        check_shardable(QWEN3_8B_4BIT, 16, "Qwen3-8B-4bit")


def test_expert_width_and_quantization_groups():
    moe = tiny_moe_config() | {"moe_intermediate_size": 95}
    with pytest.raises(ShardingError, match="95 expert MLP width"):
        check_shardable(moe, 2, "tiny-moe")
    quantized = tiny_config(heads=4, kv_heads=4, head_dim=32) | {"intermediate_size": 512,
                                                                 "quantization": {"group_size": 64, "bits": 4}}
    with pytest.raises(ShardingError, match="leaves 32 columns per rank, not whole groups of 64"):  # 128 / 4
        check_shardable(quantized, 4, "tiny-4bit")
    check_shardable(quantized, 2, "tiny-4bit")


def test_a_model_mlx_lm_cannot_split():
    from mlx_lm.models import gpt2
    assert not hasattr(gpt2.Model, "shard")  # if mlx-lm learns to, pick another type here
    with pytest.raises(ShardingError, match="cannot split gpt2 models"):
        check_shardable({"model_type": "gpt2", "n_head": 12}, 2, "a-gpt2")


def test_each_rank_keeps_its_run_of_heads():
    whole = {"keys": mx.arange(1 * 4 * 3 * 2).reshape(1, 4, 3, 2)}
    for rank in range(2):
        own = KVShards(World(size=2, rank=rank)).own_tensors("target", whole)["keys"]
        assert mx.array_equal(own, whole["keys"][:, 2 * rank:2 * rank + 2])
    assert KVShards(World(size=2, rank=1)).own_tensors("draft", whole) is whole  # the draft is whole everywhere
    geometry = KVGeometry(num_layers=2, kv_heads=1, head_dim=32, dtype=mx.float32)
    assert KVShards(World(size=4, rank=3)).whole_geometry("target", geometry).kv_heads == 4
    assert KVShards(SINGLE).whole_geometry("target", geometry) == geometry


def test_one_process_shares_with_itself():
    assert share(SINGLE, lambda: {"prompt": "hi"}) == {"prompt": "hi"}
    with pytest.raises(ValueError):
        share(SINGLE, lambda: int("x"))
    assert every_rank(SINGLE, 7) == [7] and leader_number(SINGLE, 1.5) == 1.5


def test_a_lost_peer_is_told_from_other_runtime_errors():
    error = RuntimeError("[ring] Receiving from socket 51 failed")
    assert is_lost_peer(error) and not is_lost_peer(RuntimeError("shapes do not match"))
    message = str(lost_peer(error, 1, 2))
    assert message.startswith("rank 1 of 2: another rank of this run stopped")


def test_shared_seeds_repeat_on_every_rank():
    try:
        seeds.use_shared(1234)
        first = [seeds.fresh_seed() for _ in range(3)]
        seeds.use_shared(1234)
        assert [seeds.fresh_seed() for _ in range(3)] == first
    finally:
        seeds._shared = None


def test_the_watchdog_stops_only_an_armed_stretch_without_progress():
    from mlxcore.distributed.watchdog import Watchdog
    now, stalls = [100.0], []
    watchdog = Watchdog(World(size=2, rank=1), limit=0.2, on_stall=stalls.append, clock=lambda: now[0])
    now[0] += 5  # silent, but nothing armed yet: loading, or waiting for the user
    with watchdog.armed():  # arming counts as progress
        time.sleep(0.3)
        assert stalls == []
        now[0] += 0.1
        watchdog.beat()
        now[0] += 0.15
        time.sleep(0.3)
        assert stalls == []  # 0.15 s since the last beat
        now[0] += 1
        deadline = time.monotonic() + 10
        while not stalls and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(stalls) == 1 and stalls[0].startswith("rank 1 of 2: no progress for 1 s")
    single = Watchdog(SINGLE, limit=0.01, on_stall=stalls.append, clock=lambda: now[0])
    with single.armed():
        now[0] += 10
        time.sleep(0.1)
    assert len(stalls) == 1, "one process has no other rank to wait for"
