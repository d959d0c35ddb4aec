"""One step's plan: which sequences decode, which prefill how many tokens, which are preempted. Tensor-free.

A step decodes every running sequence whose prompt is in its cache and reads prompt chunks, all within
``step_tokens`` (a decode counts one token); admission counts blocks (``BlockAccount``) after prefix hits,
and preemption is by recompute (docs/internals.md, "Admission by blocks"; docs/engine.md).

Fair share between requests: a request's choices (``n``) each take a running
slot, so one request cannot run more than ``max_running`` sequences. Waiting
sequences are admitted fewest-running-siblings first, then in policy order; and
a request with nothing running takes a slot from one running two or more (its
newest choice is preempted), so no request holds every slot while another waits.
A sequence whose client has stopped reading (``paused``) keeps its slot and
blocks but is not decoded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from mlxcore.batching.policies import NO_LIMIT_TOKENS, Policy
from mlxcore.batching.sequence import Sequence
from mlxcore.device_profile import current


class BlockAccount(Protocol):
    """The pool as the scheduler sees it: counts of blocks, no tensors."""

    def obtainable(self) -> int:
        """Blocks appends could take now (free, cached or in slabs the budget can still add)."""

    def needed(self, seq: Sequence, tokens: int) -> int:
        """Blocks ``seq`` takes from ``obtainable`` to hold ``tokens`` more (a waiting one: from its start,
        after the prefix it would find cached)."""

    def held(self, seq: Sequence) -> int:
        """Blocks that become obtainable if ``seq`` lets go of its cache (those no other sequence holds)."""


@dataclass
class StepPlan:
    decode: list[Sequence] = field(default_factory=list)  # one token each, in one batched pass
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, most prompt tokens to feed)
    admitted: list[Sequence] = field(default_factory=list)  # newly admitted this step (also in ``prefill``)
    preempted: list[Sequence] = field(default_factory=list)  # to let go of their caches and wait again
    late: list[Sequence] = field(default_factory=list)  # found unable to meet their deadline this step


class Scheduler:
    """Waiting and running sequences, and the plan of each step (see the module docstring)."""

    def __init__(self, policy: Policy, account: BlockAccount, *, step_tokens: int | None = None,
                 max_running: int = 8) -> None:
        # None: the device profile's, and a token for every running sequence at least
        step_tokens = step_tokens or max(current().step_tokens, max_running)
        if step_tokens < max_running:
            raise ValueError(f"step_tokens ({step_tokens}) must be at least max_running ({max_running}).")
        self.policy, self.account = policy, account
        self.step_tokens, self.max_running = step_tokens, max_running
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.step_seconds = 0.0  # recent seconds per step, for deadline estimates (set by the runner)

    def add(self, seq: Sequence) -> None:
        """Queue a new (or preempted) sequence."""
        seq.admitted = False
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Forget a finished or cancelled sequence, wherever it is."""
        for queue in (self.waiting, self.running):
            if seq in queue:
                queue.remove(seq)

    def replace(self, seq: Sequence, children: list[Sequence]) -> None:
        """A prompt read for several choices goes on as one running sequence per choice."""
        index = self.running.index(seq)
        self.running[index:index + 1] = children
        for child in children:
            child.admitted = True

    def swap(self, seq: Sequence, other: Sequence) -> None:
        """``other`` takes ``seq``'s place, waiting or running (a cancelled choice hands on its prompt)."""
        for queue in (self.waiting, self.running):
            if seq in queue:
                queue[queue.index(seq)] = other

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def plan(self, now: float) -> StepPlan:
        plan = StepPlan()
        reading: list[Sequence] = []  # running sequences with prompt tokens to read
        need = 0  # blocks the decoding sequences' next tokens take
        for seq in self.running:
            if seq.ready:
                plan.decode.append(seq)
                need += self.account.needed(seq, 1)
            elif seq.prefill_left:
                reading.append(seq)
        # Most steps only decode, within the blocks the replies hold: then the pool has nothing to say
        # (``obtainable`` is never negative: nobody is preempted for tokens that need no block).
        if need or reading or self.waiting:
            available = self._room_for_decode(plan, need, self.account.obtainable(), now)
            budget = self.step_tokens - len(plan.decode)
            budget, available = self._prefill_running(plan, reading, budget, available, now)
            if self.waiting:
                self._admit(plan, budget, available, now)
        plan.late = [seq for seq in self.running + self.waiting
                     if seq.deadline is not None and not seq.late and self._misses_deadline(seq, now)]
        for seq in plan.late:
            seq.late = True
        return plan

    def _room_for_decode(self, plan: StepPlan, need: int, available: int, now: float) -> int:
        """Preempt from the policy's end while the decoding sequences' next tokens (``need`` blocks) do not fit."""
        while need > available and self.running:
            victim = self._worst_running(now)
            if victim in plan.decode:
                need -= self.account.needed(victim, 1)
            available += self._preempt(plan, victim)
        return available - need

    def _prefill_running(self, plan: StepPlan, reading: list[Sequence], budget: int, available: int,
                         now: float) -> tuple[int, int]:
        """Next chunks of prompts being read, in policy order, while tokens and blocks last."""
        for seq in sorted(reading, key=lambda s: self.policy.key(s, now)):
            if budget <= 0:
                break
            if seq in plan.preempted:  # (preempted to make room for the decoding ones)
                continue
            count = min(seq.prefill_left, budget)
            need = self.account.needed(seq, count)
            if need > available:
                continue
            plan.prefill.append((seq, count))
            budget, available = budget - count, available - need
        return budget, available

    def _admit(self, plan: StepPlan, budget: int, available: int, now: float) -> None:
        """Admit waiting sequences, fair share then policy order, while their whole prompts fit (preempting
        where the policy or the fair share says)."""
        running = Counter(seq.group for seq in self.running)
        for seq in sorted(self.waiting, key=lambda s: (running[s.group], *self.policy.key(s, now))):
            if budget <= 0:
                return
            if seq in plan.preempted:  # its blocks, counted as freed, would also count as its cached prefix
                continue
            if len(self.running) >= self.max_running:
                freed = self._take_slot(plan, seq, running)
                if freed is None:
                    return
                available += freed
            need = self.account.needed(seq, seq.length)
            while need > available and self._may_preempt_for(seq, now):
                available += self._preempt(plan, self._worst_running(now))
            if need > available:
                return  # the rest wait behind it, in order
            self.waiting.remove(seq)
            self.running.append(seq)
            running[seq.group] += 1
            seq.admitted = True
            if seq.first_scheduled is None:
                seq.first_scheduled = now
            count = min(max(seq.prefill_left, 0), budget)
            plan.admitted.append(seq)
            plan.prefill.append((seq, count))
            budget -= max(count, 1)
            available -= need

    def _take_slot(self, plan: StepPlan, seq: Sequence, running: Counter) -> int | None:
        """Fair share: a request with nothing running preempts a choice of the request running the most
        sequences, if that is two or more (the one with the least output to recompute). The blocks freed,
        or None when no slot is taken."""
        if running[seq.group] or not running:
            return None
        group, count = running.most_common(1)[0]
        if count < 2:
            return None
        victim = min((s for s in self.running if s.group == group), key=lambda s: s.generated)
        running[group] -= 1
        return self._preempt(plan, victim)

    def _may_preempt_for(self, seq: Sequence, now: float) -> bool:
        return bool(self.running) and self.policy.preempts(seq, self._worst_running(now), now)

    def _worst_running(self, now: float) -> Sequence:
        return max(self.running, key=lambda s: self.policy.key(s, now))

    def _preempt(self, plan: StepPlan, victim: Sequence) -> int:
        """Take ``victim`` out of the running set; the blocks it frees."""
        freed = self.account.held(victim)
        self.running.remove(victim)
        for index, (seq, _) in enumerate(plan.prefill):
            if seq is victim:
                del plan.prefill[index]
                break
        for chosen in (plan.admitted, plan.decode):
            if victim in chosen:
                chosen.remove(victim)
        victim.preemptions += 1
        plan.preempted.append(victim)
        self.add(victim)
        return freed

    def _misses_deadline(self, seq: Sequence, now: float) -> bool:
        assert seq.deadline is not None  # (``plan`` asks of those with one)
        if now > seq.deadline:
            return True
        left = seq.tokens_left
        return left < NO_LIMIT_TOKENS and now + left * self.step_seconds > seq.deadline
