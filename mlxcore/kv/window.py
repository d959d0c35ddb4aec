"""Arithmetic of the rotating window cache: which slot holds which token, and who sees whom.

Attention rule (``keep`` first tokens, window of ``max_size``): the query at
position q attends to key position j iff j <= q and (j < keep or j > q - recent),
with recent = max_size - keep. So every query sees at most max_size keys: the
first ``keep`` and the ``recent`` latest, itself included.

Storage: ``keep + ring`` slots with ring = recent + max_rewind. Position p lives
in slot p if p < keep, else in slot keep + (p - keep) % ring. The ring keeps
``max_rewind`` tokens more than attention needs, so a rewind of that many tokens
still finds the whole window of the token it rewinds to. ``high`` is one past the
largest position ever written; the ring then holds positions
[max(keep, high - ring), offset) (slots of positions >= offset are stale after a
rewind and masked out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Window:
    """The geometry of a rotating cache."""

    max_size: int  # the most keys a query attends to (keep + recent)
    keep: int  # leading tokens always attended (the system prompt)
    max_rewind: int  # tokens a trim may remove after the ring wrapped

    def __post_init__(self) -> None:
        if not 0 <= self.keep < self.max_size:
            raise ValueError(f"keep ({self.keep}) must be at least 0 and below max_size ({self.max_size}).")
        if self.max_rewind < 0:
            raise ValueError("max_rewind must be at least 0.")

    @property
    def recent(self) -> int:
        return self.max_size - self.keep

    @property
    def ring(self) -> int:
        return self.recent + self.max_rewind

    @property
    def slots(self) -> int:
        """Physical slots: keep + ring (= max_size + max_rewind, whatever keep is)."""
        return self.max_size + self.max_rewind

    def ring_start(self, high: int) -> int:
        """The oldest position the ring still holds when ``high`` positions were ever written."""
        return max(self.keep, high - self.ring)

    def slot_of(self, position: int) -> int:
        return position if position < self.keep else self.keep + (position - self.keep) % self.ring

    def max_trim(self, offset: int, high: int) -> int:
        """The most tokens a trim may remove and still leave the next token its whole window."""
        start = self.ring_start(high)
        if start == self.keep:
            return offset  # no ring slot was ever overwritten
        return max(0, min(offset, offset - self.recent + 1 - start))

    def fits_in_place(self, offset: int, high: int, n: int) -> bool:
        """Whether ``n`` new tokens can be written before attention without evicting a key they need."""
        return self.ring_start(max(high, offset + n)) <= max(self.keep, offset - self.recent + 1)

    def slot_positions(self, offset: int, high: int, count: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
        """Position held by each of the first ``count`` slots, and whether it is valid (< offset)."""
        slots = np.arange(count)
        start = self.ring_start(high)
        ring = start + (slots - start) % self.ring  # slots - keep - (start - keep), mod ring
        positions = np.where(slots < self.keep, slots, ring)
        return positions, positions < offset

    def mask(self, first_query: int, n: int, positions: npt.NDArray[np.intp],
             valid: npt.NDArray[np.bool_], window_size: int | None = None) -> npt.NDArray[np.bool_]:
        """(n, len(positions)) booleans: query first_query + i may attend to key slot j."""
        q = np.arange(first_query, first_query + n)[:, None]
        p = positions[None, :]
        seen = valid[None, :] & (p <= q) & ((p < self.keep) | (p > q - self.recent))
        if window_size is not None:
            seen &= p > q - window_size
        return seen
