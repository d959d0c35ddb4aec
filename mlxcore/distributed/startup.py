"""What the ranks settle before any weights load: that they match, and how they will decide alike."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from mlxcore import decision_clock, seeds
from mlxcore.configs import KVConfig
from mlxcore.distributed.agreement import check_same, software
from mlxcore.distributed.broadcast import leader_number, share
from mlxcore.distributed.fail_fast import watch_ring_failures
from mlxcore.distributed.world import World

if TYPE_CHECKING:
    from mlxcore.loading import ModelFiles


def join_ranks(world: World, target: ModelFiles, draft: ModelFiles | None, kv: KVConfig, num_draft: int) -> None:
    """Over several ranks: check every rank runs the same software, model files (``ModelFiles``) and options
    (``RankMismatchError``), then share rank 0's random seeds and clock readings. Nothing for one process."""
    if not world.distributed:
        return
    watch_ring_failures(world)  # a peer lost while this rank waits on the ring must not hang it
    # (the disk tier is off over several ranks, and its default budget follows each machine's free space)
    shared_kv = replace(kv, disk_kv_bytes=0, disk_kv_dir=None)
    identity = software() | {"target model": target.fingerprint, "draft model": draft.fingerprint if draft else "none",
                             "KV cache options": repr(shared_kv), "draft length": str(num_draft)}
    check_same(world, identity)
    seeds.use_shared(share(world, lambda: int.from_bytes(os.urandom(8), "little")))
    decision_clock.share_with(lambda reading: leader_number(world, reading))
