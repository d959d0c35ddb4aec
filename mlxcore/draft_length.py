"""Adaptive draft length: choose k to maximise committed tokens per second, or 0 to decode plainly.

Measured, not assumed: the acceptance rate at each draft position (given the
earlier ones were accepted), the seconds of a plain target step P, the seconds
D of one draft pass (timed now and then in a round that synchronises after
drafting) and the seconds F of a round beyond its drafts (the verify pass, the
synchronisation, emitting its tokens), so a round of k costs about F + D k; F
itself grows with k where a pass's time grows with its rows (``_fit_fixed``).
Both kinds of step are timed alike, from the last step's end to their tokens
emitted (``BatchRunner._decode``). Expected tokens per round are
1 + sum_{j<=k} prod_{i<=j} a_i.

A position's acceptance is learned only by drafting it, so now and then a round
drafts one past the best k: an estimate that fell early (a reply's first words)
is not kept for good.

While it decodes plainly it probes now and then, with a round of one draft: whether
the draft's first guess is taken decides whether any k pays, and a failed probe then
costs one draft pass and a verification of two rows (a probe of the best k drafted k,
each a verification row more, which a CPU pays in full). A probe first feeds the draft
every token it missed, at a measured C seconds a token. Plain steps after a round
number as many as the tokens a probe would feed, so probing costs about C / P of
the plain time whatever the wait: where that is over ``probe_budget`` (a hybrid
draft, whose prompt reading is slow on a CPU), a draft that stopped paying is
not probed again.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import ClassVar


@dataclass
class DraftLengthController:
    max_k: int = 8  # the largest draft length ever chosen (--num-draft)
    weight: float = 0.15  # how fast the acceptance averages follow new rounds
    probe_every: int = 24  # while decoding plainly, try one speculative round after this many tokens...
    max_probe_every: int = 384  # ...doubling the wait after each probe that does not pay, up to this
    probe_budget: float = 0.1  # ...if feeding the draft what it missed costs at most this share of plain steps
    window: int = 15  # timings are medians of this many recent samples: robust to a stray slow step
    refresh_every: int = 64  # while drafting, take one plain step after this many rounds to re-measure P
    explore_every: int = 16  # while drafting, draft one past the best k after this many rounds
    time_draft_every: ClassVar[int] = 32  # rounds between two timings of the draft passes
    first_plain_steps: ClassVar[int] = 3  # plain steps timed before any round: P is their median, not one step's

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"the draft length cap must be at least 1, not {self.max_k}")
        self.accept = [0.8] * self.max_k  # a_j: P(draft j accepted | drafts before it), optimistic: draft early
        self.plain_samples: deque[float] = deque(maxlen=self.window)  # recent seconds of a plain target step (P)
        self.draft_samples: deque[tuple[int, float]] = deque(maxlen=self.window)  # (k, seconds) of k draft passes
        self.fixed_samples: deque[tuple[int, float]] = deque(maxlen=self.window)  # (k, seconds) of a round
        # beyond its drafts (F)
        self.catch_up_samples: deque[float] = deque(maxlen=self.window)  # ... a token of a draft's catch-up (C)
        self.plain_run = 0  # plain steps since the last speculative round
        self.round_run = 0  # speculative rounds since the last plain step
        self.untimed_rounds = 0  # rounds since the draft passes were last timed
        self.probe_wait = self.probe_every  # plain steps before the next probe
        self.unexplored_rounds = 0  # rounds since one drafted past the best k
        self._best: tuple[int, float] | None = None  # best() until the next round
        self._by_rows: dict[int, DraftLengthController] = {}  # ``for_rows``
        self._traced: set[int] = set()  # draft lengths whose rounds ran
        self._per_draft: float | None = None  # D (``_fit_draft``)
        self._fixed_in_steps = 1.0  # a round's fixed time in plain steps, until a round here measures it
        self._fixed_line = (0.0, 0.0)  # F at k as base + slope k (``_fit_fixed``)

    def for_rows(self, rows: int) -> DraftLengthController:
        """The controller of steps that decode ``rows`` replies: a batch's steps and rounds take other times
        than a lone reply's (this one), so each batch size learns its own; the learning lasts the engine. A new
        size starts from the nearest size's learning (``learn_from``)."""
        if rows == 1:
            return self
        made = self._by_rows.get(rows)
        if made is None:
            made = self._by_rows[rows] = DraftLengthController(max_k=self.max_k)
            known = [(abs(size - rows), size, each) for size, each in self._by_rows.items()
                     if each.per_draft is not None]
            if self.per_draft is not None:
                known.append((rows - 1, 1, self))
            if known:
                made.learn_from(min(known, key=lambda entry: entry[:2])[2])
        return made

    def learn_from(self, other: DraftLengthController) -> None:
        """Start from what ``other`` (another batch size's) learned: the acceptance (the pair's and the text's,
        whatever the batch), a draft pass's seconds (until this size times its own), a catch-up token's (one
        sample, which this size's own soon outvote), a round's fixed time in plain steps and the probing pace. Its plain step it measures
        first, as ever: so a new size neither spends measuring rounds on a draft known to lose, nor waits to
        draft one known to win."""
        self.accept = list(other.accept)
        if other.round_fixed is not None and other.plain_step:  # a round's fixed part grows with the batch's step
            self._fixed_in_steps = other.round_fixed / other.plain_step
        self._per_draft = other.per_draft  # (not a sample: this size's own timings are fitted alone)
        if other.catch_up_samples:
            self.catch_up_samples.append(statistics.median(other.catch_up_samples))
        self.probe_wait = other.probe_wait

    @property
    def plain_step(self) -> float | None:
        """P: seconds of one plain target step (median of recent samples)."""
        return statistics.median(self.plain_samples) if self.plain_samples else None

    @property
    def per_draft(self) -> float | None:
        """D: seconds of one draft pass (``_fit_draft``)."""
        return self._per_draft

    def _fit_draft(self) -> None:
        """D from the timed draft phases: one of k passes costs s + D k, s its synchronisation and its first
        feed (a round's fixed cost, which F then holds). Fitted when recent timings span several k; else their
        median per pass (which charges s to the passes: a timing at small k makes every k look dear)."""
        per_pass = statistics.median(seconds / k for k, seconds in self.draft_samples)
        slope = _slope(self.draft_samples)
        self._per_draft = slope if slope is not None and 0.0 < slope < per_pass else per_pass

    @property
    def round_fixed(self) -> float | None:
        """F: seconds of a round beyond its draft passes (median of recent samples, at the k they drafted)."""
        return statistics.median(seconds for _, seconds in self.fixed_samples) if self.fixed_samples else None

    def _fit_fixed(self) -> None:
        """F as base + slope k over the recent rounds (probes draft one, exploring rounds one more): the
        verification's k + 1 rows a reply cost more with k where a pass's time grows with its rows (a CPU's
        products), which the draft passes' timing does not see; where rows are nearly free (a GPU reading the
        weights once for them all) the slope is about 0. Until the rounds span two lengths, F is flat."""
        slope = _slope(self.fixed_samples) or 0.0
        if slope:
            cap = statistics.median(seconds / k for k, seconds in self.fixed_samples)  # (so that base >= 0)
            slope = min(max(slope, 0.0), cap)
        self._fixed_line = (statistics.median(seconds - slope * k for k, seconds in self.fixed_samples), slope)

    def draft_timing_due(self) -> bool:
        """Whether the coming round should synchronise after drafting, to time the draft passes."""
        return not self.draft_samples or self.untimed_rounds >= self.time_draft_every

    def choose(self) -> int:
        """The draft length for the next round; 0 means one plain decoding step."""
        plain = self.plain_step
        if plain is None or len(self.plain_samples) < self.first_plain_steps:
            return 0  # measure plain steps first: the baseline every k must beat, which rounds re-measure rarely
        if self.per_draft is None:
            return min(4, self.max_k)  # then a draft pass's time: over several, which share a round's fixed costs
        if self.round_run >= self.refresh_every:
            return 0
        k, rate = self.best()
        if rate > 1.0 / plain:
            self.probe_wait = self.probe_every  # drafting pays: probe promptly if that changes
            self.unexplored_rounds += 1
            if k < self.max_k and self.unexplored_rounds >= self.explore_every:
                self.unexplored_rounds = 0
                return k + 1
            return k
        if self.plain_run >= self.probe_wait and self._probe_pays_its_catch_up():  # the draft may do better now
            self.probe_wait = min(2 * self.probe_wait, self.max_probe_every)
            return 1  # whether its first guess is taken now decides whether any k pays: the cheapest round asks
        return 0

    def _probe_pays_its_catch_up(self) -> bool:
        if not self.catch_up_samples or self.plain_step is None:
            return True
        return bool(statistics.median(self.catch_up_samples) <= self.probe_budget * self.plain_step)

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """Record feeding the draft ``tokens`` it missed (before a round) in ``seconds``. Only a catch-up as long as
        a probe's counts: the few tokens a round leaves the draft short of cost mostly a pass's fixed time."""
        if tokens >= self.probe_every - 1:
            self.catch_up_samples.append(seconds / tokens)

    def best(self) -> tuple[int, float]:
        """(k, expected tokens per second) of the best draft length by the current estimates."""
        if self._best is None:  # round estimates change only with rounds: plain steps reuse it
            rate, k = max((self.expected_tokens(k) / self.round_seconds(k), k) for k in range(1, self.max_k + 1))
            self._best = (k, rate)
        return self._best

    def expected_tokens(self, k: int) -> float:
        total, run = 1.0, 1.0
        for a in self.accept[:k]:
            run *= a
            total += run
        return total

    def round_seconds(self, k: int) -> float:
        if self.fixed_samples:
            base, slope = self._fixed_line
            fixed = base + slope * k
        else:  # no round measured here yet: in plain steps, as the size it learned from measured it
            fixed = (self.plain_step or 0.0) * self._fixed_in_steps
        return fixed + k * (self.per_draft or 0.0)

    def observe_plain(self, seconds: float) -> None:
        self.plain_samples.append(seconds)
        self.plain_run += 1
        self.round_run = 0

    def observe_round(self, k: int, accepted: int | list[int], seconds: float | None,
                      draft_seconds: float | None = None, proposed: list[int] | None = None) -> None:
        """Record one round: k drafted, ``accepted`` kept (by each reply of a batch's round), ``seconds`` it took
        (as a plain step's: from the last step's end to its tokens emitted; None: a round not to time, whose
        pass read a prompt's rows too).

        ``draft_seconds``: the time its k draft passes took, when this round was timed. ``proposed``: each
        reply's drafted count where it may be fewer than k (prompt lookup's)."""
        self._best = None
        # A draft length's first round traces its pass anew (mx.compile, for a new row count): not its time.
        traced = k in self._traced
        self._traced.add(k)
        kept_counts = [accepted] if isinstance(accepted, int) else accepted
        for kept, drafted in zip(kept_counts, proposed or [k] * len(kept_counts)):
            for j in range(min(kept + 1, drafted)):  # positions after the first rejection were not tested
                self.accept[j] += self.weight * ((1.0 if j < kept else 0.0) - self.accept[j])
        if draft_seconds is not None and traced:
            self.draft_samples.append((k, draft_seconds))
            self._fit_draft()
            self.untimed_rounds = 0
        else:
            self.untimed_rounds += 1
        if self.per_draft is not None and traced and seconds is not None:
            self.fixed_samples.append((k, max(seconds - k * self.per_draft, 0.0)))
            self._fit_fixed()
        self.plain_run = 0
        self.round_run += 1


def _slope(samples: deque[tuple[int, float]]) -> float | None:
    """The least-squares slope of seconds over k of (k, seconds) samples; None while they are all at one k."""
    ks = [k for k, _ in samples]
    if len(set(ks)) < 2:
        return None
    return statistics.linear_regression(ks, [seconds for _, seconds in samples]).slope
