"""A sharded target's KV cache as one whole: session files hold every head, whatever the rank count.

``shard()`` gives rank r the r-th contiguous run of the target's KV heads (its
k_proj and v_proj rows), so a saved cache is every rank's tensors joined on the
heads axis, in rank order. Saving gathers them (every rank takes part); restoring
keeps this rank's run. A file saved on 2 ranks therefore opens on 1 or 4 ranks
as well. The draft is whole on every rank and passes unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx

from mlxcore.distributed.world import SINGLE, World
from mlxcore.kv.geometry import KVGeometry

HEADS_AXIS = 1  # every saved KV tensor is (1, kv_heads, tokens, width) (see kv/stored.py)
SHARDED_ROLES = ("target",)


class KVShards:
    """Joins and splits the ``SHARDED_ROLES`` caches' saved tensors over ``world``'s ranks."""

    def __init__(self, world: World = SINGLE) -> None:
        self.world = world

    def sharded(self, role: str) -> bool:
        return self.world.distributed and role in SHARDED_ROLES

    def whole_geometry(self, role: str, geometry: KVGeometry) -> KVGeometry:
        """``geometry`` of this rank's cache as the whole model's (every rank's heads)."""
        if not self.sharded(role):
            return geometry
        return replace(geometry, kv_heads=geometry.kv_heads * self.world.size)

    def whole_tensors(self, role: str, tensors: dict[str, mx.array]) -> dict[str, mx.array]:
        """Every rank's heads joined (a collective: every rank calls it with its own tensors, same names)."""
        if not self.sharded(role):
            return tensors
        group = self.world.group
        whole = {name: mx.distributed.all_gather(array.swapaxes(0, HEADS_AXIS), group=group).swapaxes(0, HEADS_AXIS)
                 for name, array in sorted(tensors.items())}
        mx.eval(whole)
        return whole

    def own_tensors(self, role: str, tensors: dict[str, mx.array]) -> dict[str, mx.array]:
        """This rank's run of heads from whole tensors."""
        if not self.sharded(role):
            return tensors
        rank, size = self.world.rank, self.world.size
        own = {}
        for name, array in tensors.items():
            heads = array.shape[HEADS_AXIS] // size
            own[name] = array[:, rank * heads:(rank + 1) * heads]
        return own
