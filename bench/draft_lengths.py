"""A draft length that does not adapt, for benchmarks that compare at equal k and tests that need the same rounds
in every run (the engine's ``DraftLengthController`` follows this host's timings)."""

from __future__ import annotations

from mlxcore.draft_length import DraftLengthController


class FixedDraftLength(DraftLengthController):
    """Always ``k`` tokens a round (0: always a plain step); ``max_k`` the cap the engine sizes rewinds for.
    ``time_draft_every``: rounds between two timings of the draft passes (tests time every few rounds)."""

    def __init__(self, k: int, max_k: int | None = None, time_draft_every: int | None = None) -> None:
        super().__init__(max_k=max_k or max(k, 1))
        self.k = k
        if time_draft_every is not None:
            self.time_draft_every = time_draft_every

    def choose(self) -> int:
        return self.k

    def for_rows(self, rows: int) -> DraftLengthController:
        return self  # the same k for a batch's rounds
