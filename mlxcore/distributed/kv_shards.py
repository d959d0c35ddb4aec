"""A sharded target's KV cache as one whole: session files hold every head, whatever the rank count.

``shard()`` gives rank r the r-th contiguous run of the target's KV heads (its
k_proj and v_proj rows), so a saved cache is every rank's tensors joined on the
heads axis, in rank order. Saving gathers them (every rank takes part); restoring
keeps this rank's run. A file saved on 2 ranks therefore opens on 1 or 4 ranks
as well. The draft is whole on every rank and passes unchanged.

A hybrid model's linear states (``linear.<set>.<layer>.<part>``, ``kv/hybrid.py``) are split the same way:
the recurrent state ``(1, value heads, dv, dk)`` by its heads; the convolution state ``(1, 3, channels)``
by each of its three runs of channels (queries, keys, values: mlx-lm's ``shard()`` splits each), which a
whole tensor holds one after the other.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx

from mlxcore.distributed.world import SINGLE, World
from mlxcore.kv.geometry import KVGeometry

HEADS_AXIS = 1  # every saved KV tensor is (1, kv_heads, tokens, width) (see kv/stored.py)
CONV_AXIS = 2  # a linear layer's convolution state is (1, kernel - 1, channels)
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
        whole = {}
        for name, array in sorted(tensors.items()):
            axis = CONV_AXIS if _is_conv(name) else HEADS_AXIS
            whole[name] = mx.distributed.all_gather(array.swapaxes(0, axis), group=group).swapaxes(0, axis)
            if _is_conv(name):  # [q0 k0 v0 q1 k1 v1 ...] -> [q0 q1 .. k0 k1 .. v0 v1 ..]
                runs = _runs(array.shape[CONV_AXIS], tensors[name[:-1] + "1"])
                parts = mx.split(whole[name], self.world.size, axis=CONV_AXIS)
                whole[name] = mx.concatenate([mx.split(part, _cuts(runs), axis=CONV_AXIS)[run]
                                              for run in range(3) for part in parts], axis=CONV_AXIS)
        mx.eval(whole)
        return whole

    def own_tensors(self, role: str, tensors: dict[str, mx.array]) -> dict[str, mx.array]:
        """This rank's run of heads from whole tensors."""
        if not self.sharded(role):
            return tensors
        rank, size = self.world.rank, self.world.size
        own = {}
        for name, array in tensors.items():
            if _is_conv(name):  # this rank's share of each run of channels
                runs = _runs(array.shape[CONV_AXIS], tensors[name[:-1] + "1"])
                own[name] = mx.concatenate([mx.split(run, size, axis=CONV_AXIS)[rank]
                                            for run in mx.split(array, _cuts(runs), axis=CONV_AXIS)], axis=CONV_AXIS)
                continue
            heads = array.shape[HEADS_AXIS] // size
            own[name] = array[:, rank * heads:(rank + 1) * heads]
        return own


def _is_conv(name: str) -> bool:
    return name.startswith("linear.") and name.endswith(".0")


def _runs(channels: int, recurrent: mx.array) -> tuple[int, int, int]:
    """(queries, keys, values) channels of a convolution state of ``channels``, beside its layer's recurrent
    state (1, value heads, dv, dk) of the same rank count: values are heads x dv, queries and keys the rest."""
    values = recurrent.shape[1] * recurrent.shape[2]
    keys = (channels - values) // 2
    return keys, keys, values


def _cuts(runs: tuple[int, int, int]) -> list[int]:
    return [runs[0], runs[0] + runs[1]]
