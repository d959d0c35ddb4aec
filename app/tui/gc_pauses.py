"""Keep Python's full garbage collections out of the way of a streaming reply.

With Textual's widgets on the heap a full (generation 2) collection pauses the
event loop for 0.1-0.2 s, measured here; one landing mid-reply is a stall the
user feels. While a reply streams, full collections wait (young ones still
run); when it ends, one full collection runs and what survives is frozen, so
later full collections only look at objects made after it.
"""

from __future__ import annotations

import gc

_HELD = 10**9  # a generation-2 threshold that is never reached


class CollectorHold:
    """Defers full collections between ``hold`` and ``release``."""

    def __init__(self) -> None:
        self._saved: tuple[int, int, int] | None = None

    def hold(self) -> None:
        if self._saved is None:
            self._saved = gc.get_threshold()
            gc.set_threshold(self._saved[0], self._saved[1], _HELD)

    def release(self) -> None:
        """Restore the thresholds, collect once and freeze the survivors."""
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None
        gc.collect()
        gc.freeze()
