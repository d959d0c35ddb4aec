"""Which rank this process is, of how many: ``current_world()``."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mlx.core as mx

# mlx.launch sets MLX_RANK and, for the ring backend, MLX_HOSTFILE (JACCL: MLX_IBV_DEVICES)
LAUNCH_VARIABLES = ("MLX_HOSTFILE", "MLX_IBV_DEVICES")


@dataclass(frozen=True)
class World:
    """The processes one model runs on. ``group`` is None for a single process."""

    group: mx.distributed.Group | None = None
    rank: int = 0
    size: int = 1

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def leader(self) -> bool:
        """Rank 0: it reads the user's input and writes what the user sees."""
        return self.rank == 0


SINGLE = World()


def launched() -> bool:
    """True when ``mlx.launch`` (or something that sets the same variables) started this process."""
    return "MLX_RANK" in os.environ and any(os.environ.get(name) for name in LAUNCH_VARIABLES)


@lru_cache(maxsize=1)
def current_world() -> World:
    """This process's world: the ring (or JACCL) group ``mlx.launch`` set up, else a single process.

    A launch whose group cannot form (a peer that never connects, a bad host file)
    raises ``DistributedError`` with MLX's reason.
    """
    if not launched():
        return SINGLE
    import mlxcore  # noqa: F401  (optimized BLAS before mlx)
    import mlx.core as mx

    from mlxcore.distributed.errors import DistributedError

    try:
        group = mx.distributed.init(strict=True)
    except RuntimeError as error:
        raise DistributedError(f"The distributed group did not form ({error}); check the host file and that "
                               "every host runs `mlx.launch` with the same one.") from None
    if group.size() == 1:
        return SINGLE
    return World(group, group.rank(), group.size())  # (startup watches the ring: ``fail_fast``)


def leave_interrupts_to_leader(world: World) -> None:
    """On ranks other than 0, ctrl+c does nothing: from a terminal it reaches every local rank at its own step,
    and rank 0 is the one that decides (it stops the others in step, or they see it leave)."""
    if world.distributed and not world.leader:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
