"""Before the weights load, every rank must run the same thing: mlxchat, MLX, mlx-lm, model files, options."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from mlxcore.distributed.broadcast import every_rank_object
from mlxcore.distributed.errors import RankMismatchError
from mlxcore.distributed.world import World

PACKAGES = ("mlxchat", "mlx", "mlx-lm")


def software() -> dict[str, str]:
    """The versions that must match on every rank."""
    found = {}
    for name in PACKAGES:
        try:
            found[f"{name} version"] = version(name)
        except PackageNotFoundError:
            found[f"{name} version"] = "not installed"
    return found


def check_same(world: World, identity: dict[str, str]) -> None:
    """``RankMismatchError`` naming the first difference between rank 0's ``identity`` and another rank's.

    ``identity`` maps what (e.g. "target model") to a fingerprint or setting; every rank calls this.
    """
    identities = every_rank_object(world, identity)
    first = identities[0]
    for rank, other in enumerate(identities[1:], start=1):
        for key in sorted(set(first) | set(other)):
            if first.get(key) != other.get(key):
                raise RankMismatchError(
                    f"rank {rank} has {key} {other.get(key)!r} where rank 0 has {first.get(key)!r}: every rank must "
                    "run the same mlxchat, MLX and mlx-lm versions, with the same model files and options.")
