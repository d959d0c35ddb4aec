"""The clock whose readings steer decisions: the draft length, the batching scheduler's pace and order.

One process: ``time.monotonic()``. Ranks of one model must decide alike, so
each reading is rank 0's, shared (``share_with``); readings that only feed
figures (time to first token, tokens per second) stay local.
"""

from __future__ import annotations

import time
from collections.abc import Callable

_share: Callable[[float], float] | None = None


def now() -> float:
    """Seconds on a monotonic clock; rank 0's reading when the model runs over several ranks."""
    value = time.monotonic()
    return _share(value) if _share is not None else value


def share_with(share: Callable[[float], float] | None) -> None:
    """Pass every reading through ``share`` (None: local readings again)."""
    global _share
    _share = share
