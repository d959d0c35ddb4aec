"""Adaptive draft length: choose k to maximise committed tokens per second, or 0 to decode plainly.

Measured, not assumed: the acceptance rate at each draft position (given the
previous ones were accepted), the seconds of one draft step, of a verify pass
over k + 1 tokens, and of a plain target step. Expected tokens per round with k
drafts is 1 + sum_{j<=k} prod_{i<=j} a_i; its time is k x draft step + verify(k).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftLengthController:
    max_k: int = 8  # the largest draft length ever chosen (--num-draft)
    weight: float = 0.15  # how fast the moving averages follow new measurements
    probe_every: int = 24  # while decoding plainly, try one speculative round after this many tokens
    fixed: int | None = None  # always draft exactly this many (benchmarks that compare at equal k)
    accept: list[float] = field(default_factory=list)  # a_j: P(draft j accepted | drafts before it accepted)
    draft_step: float | None = None  # seconds per draft token
    plain_step: float | None = None  # seconds per plain target token
    verify: dict[int, float] = field(default_factory=dict)  # k -> seconds of a verify pass over k + 1 tokens
    plain_run: int = 0  # plain tokens since the last speculative round
    history: list[int] = field(default_factory=list)  # k chosen for each round (0 = plain step)

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"the draft length cap must be at least 1, not {self.max_k}")
        self.accept = self.accept or [0.8] * self.max_k  # optimistic start: try drafting first

    def choose(self) -> int:
        """The draft length for the next round; 0 means one plain decoding step."""
        k = self._choose()
        self.history.append(k)
        return k

    def _choose(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.plain_step is None:
            return 0  # measure a plain step first: it is the baseline every k must beat
        if self.draft_step is None:
            return min(4, self.max_k)
        k, rate = self.best()
        if rate > 1.0 / self.plain_step or self.plain_run >= self.probe_every:
            return k
        return 0

    def best(self) -> tuple[int, float]:
        """(k, expected tokens per second) of the best draft length by the current estimates."""
        rates = [(self.expected_tokens(k) / self.round_seconds(k), k) for k in range(1, self.max_k + 1)]
        rate, k = max(rates)
        return k, rate

    def expected_tokens(self, k: int) -> float:
        total, run = 1.0, 1.0
        for a in self.accept[:k]:
            run *= a
            total += run
        return total

    def round_seconds(self, k: int) -> float:
        return k * (self.draft_step or 0.0) + self.verify_seconds(k)

    def verify_seconds(self, k: int) -> float:
        """Measured if k was tried; else a straight line through the nearest measured k (or the plain step)."""
        if k in self.verify:
            return self.verify[k]
        known = sorted(self.verify.items(), key=lambda item: abs(item[0] - k))
        base_k, base = known[0] if known else (0, self.plain_step or 1.0)
        per_token = (base / (base_k + 1)) * 0.15  # extra positions in one pass cost much less than a pass
        return base + (k - base_k) * per_token

    def observe_plain(self, seconds: float) -> None:
        self.plain_step = self._avg(self.plain_step, seconds)
        self.plain_run += 1

    def observe_round(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """Record one speculative round: k drafted, ``accepted`` kept, and how long each part took."""
        for j in range(min(accepted + 1, k)):  # positions after the first rejection were not tested
            self.accept[j] = self._avg(self.accept[j], 1.0 if j < accepted else 0.0)
        self.draft_step = self._avg(self.draft_step, draft_seconds / k)
        self.verify[k] = self._avg(self.verify.get(k), verify_seconds)
        self.plain_run = 0

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.weight * (new - old)
