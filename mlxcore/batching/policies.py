"""Scheduling policies: the order waiting requests are admitted in, and who is preempted first.

A policy is a sort key (smaller is served sooner) plus a rule for preempting a
running request in favour of a waiting one. The scheduler admits waiting
requests in key order and, when the pool cannot hold the running set, preempts
the running request with the largest key. Tensor-free. The four (fcfs, priority,
shortest, deadline) and their aging: docs/internals.md, "Policies".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from mlxcore.batching.request import Priority

NO_LIMIT_TOKENS = 1 << 20  # stands for "until the context is full" when sorting by tokens left


class Scheduled(Protocol):
    """What a policy reads of a request (``scheduler.Sequence`` has it)."""

    @property
    def arrival(self) -> float: ...  # decision_clock.now() of submission
    @property
    def priority(self) -> Priority: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def tokens_left(self) -> int: ...  # prompt tokens to prefill + tokens still to generate (or NO_LIMIT_TOKENS)


class Policy(Protocol):
    name: str

    def key(self, seq: Scheduled, now: float) -> tuple:
        """Sort key: smaller is admitted sooner and preempted later."""

    def preempts(self, waiting: Scheduled, running: Scheduled, now: float) -> bool:
        """Whether ``waiting`` may take ``running``'s blocks when both cannot fit."""


@dataclass(frozen=True)
class FirstCome:
    name: str = "fcfs"

    def key(self, seq: Scheduled, now: float) -> tuple:
        return (seq.arrival,)

    def preempts(self, waiting: Scheduled, running: Scheduled, now: float) -> bool:
        return False


@dataclass(frozen=True)
class ByPriority:
    aging_seconds: float = 30.0  # waiting this long raises a request one priority level
    name: str = "priority"

    def level(self, seq: Scheduled, now: float) -> float:
        return int(seq.priority) + max(now - seq.arrival, 0.0) / self.aging_seconds

    def key(self, seq: Scheduled, now: float) -> tuple:
        return (-self.level(seq, now), seq.arrival)

    def preempts(self, waiting: Scheduled, running: Scheduled, now: float) -> bool:
        return self.level(waiting, now) >= self.level(running, now) + 1


@dataclass(frozen=True)
class ShortestFirst:
    aging_tokens: float = 50.0  # credit per second of waiting, in tokens
    name: str = "shortest"

    def key(self, seq: Scheduled, now: float) -> tuple:
        return (seq.tokens_left - self.aging_tokens * max(now - seq.arrival, 0.0), seq.arrival)

    def preempts(self, waiting: Scheduled, running: Scheduled, now: float) -> bool:
        return False  # a running request has had its turn; preempting it for shorter ones would starve it


@dataclass(frozen=True)
class EarliestDeadline:
    name: str = "deadline"

    def key(self, seq: Scheduled, now: float) -> tuple:
        return (seq.deadline if seq.deadline is not None else math.inf, seq.arrival)

    def preempts(self, waiting: Scheduled, running: Scheduled, now: float) -> bool:
        return waiting.deadline is not None and (running.deadline is None or waiting.deadline < running.deadline)


POLICIES = {"fcfs": FirstCome, "priority": ByPriority, "shortest": ShortestFirst, "deadline": EarliestDeadline}


def make_policy(name: str) -> Policy:
    """The policy called ``name`` (fcfs, priority, shortest, deadline); ``ValueError`` otherwise."""
    try:
        made: Policy = POLICIES[name]()
    except KeyError:
        raise ValueError(f"Unknown scheduling policy {name!r}: choose one of {', '.join(POLICIES)}.") from None
    return made
