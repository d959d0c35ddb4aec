"""Where a reply with no seed gets its random seed.

One process: the operating system's randomness. Ranks of one model
(``mlxcore.distributed``) must draw the same tokens, so they draw their seeds
from one generator seeded alike on every rank (``use_shared``).
"""

from __future__ import annotations

import os
import random

_shared: random.Random | None = None


def fresh_seed() -> int:
    """A seed for a reply that asked for none."""
    if _shared is not None:
        return _shared.getrandbits(32)
    return int.from_bytes(os.urandom(4), "little")


def use_shared(seed: int) -> None:
    """From now on draw seeds from a generator seeded with ``seed`` (the same on every rank)."""
    global _shared
    _shared = random.Random(seed)
