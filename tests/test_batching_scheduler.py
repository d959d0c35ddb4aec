"""The scheduler's plans and the policies' orders, on a fake pool (tensor-free: no model, no MLX)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlxcore.batching.handle import RequestHandle
from mlxcore.batching.policies import ByPriority, EarliestDeadline, FirstCome, ShortestFirst, make_policy
from mlxcore.batching.request import Priority, Request
from mlxcore.batching.scheduler import Scheduler
from mlxcore.batching.sequence import Sequence
from mlxcore.params import GenerationParams

BLOCK = 16


class FakePool:
    """Blocks of 16 tokens: each sequence holds ceil(cached / 16); ``cached_prefix`` tokens are free to attach."""

    def __init__(self, blocks: int, cached_prefix: int = 0) -> None:
        self.blocks, self.cached_prefix = blocks, cached_prefix

    def used(self, running: list[Sequence]) -> int:
        return sum(-(-seq.cached // BLOCK) for seq in running)

    def obtainable(self) -> int:
        return self.blocks - self.used(self.scheduler.running)

    def needed(self, seq: Sequence, tokens: int) -> int:
        if not seq.admitted:  # from scratch, less the cached prefix (blocks held by a running sequence)
            return -(-tokens // BLOCK) - min(self.cached_prefix, tokens - 1) // BLOCK
        return -(-(seq.cached + tokens) // BLOCK) - -(-seq.cached // BLOCK)

    def held(self, seq: Sequence) -> int:
        return -(-seq.cached // BLOCK)


def make(policy=None, blocks: int = 1000, step_tokens: int = 64, max_running: int = 4, cached_prefix: int = 0):
    pool = FakePool(blocks, cached_prefix)
    scheduler = Scheduler(policy or FirstCome(), pool, step_tokens=step_tokens, max_running=max_running)
    pool.scheduler = scheduler
    return scheduler


def seq(prompt: int, arrival: float, max_new: int | None = 100, priority=Priority.NORMAL, deadline=None) -> Sequence:
    request = Request(tuple(range(1, prompt + 1)), GenerationParams(max_tokens=max_new), priority=priority,
                      deadline=deadline)
    return Sequence(request, arrival, max_new, RequestHandle(request, lambda handle: None))


class Held:
    """A sequence's caches as the scheduler sees them: the tokens they hold (``Sequence.cached``)."""

    def __init__(self) -> None:
        self.target = SimpleNamespace(offset=0)


def held(s: Sequence) -> SimpleNamespace:
    if s.caches is None:
        s.caches = Held()
    return s.caches.target


def carry_out(scheduler: Scheduler, plan) -> None:
    """What the runner does with a plan, in counts: prefill chunks, decode one token each."""
    for s in plan.preempted:
        s.caches = None  # they go back to the pool
    for s, count in plan.prefill:
        held(s).offset += min(count, s.prefill_left)
    for s in plan.decode:
        held(s).offset += 1
        s.ids.append(0)  # a token generated


def test_fcfs_admits_in_arrival_order_within_the_running_limit():
    scheduler = make(max_running=2)
    a, b, c = seq(10, 3.0), seq(10, 1.0), seq(10, 2.0)
    for s in (a, b, c):
        scheduler.add(s)
    plan = scheduler.plan(now=5.0)
    assert plan.admitted == [b, c] and scheduler.waiting == [a]


def test_a_long_prompt_joins_over_several_steps_within_the_token_budget():
    scheduler = make(step_tokens=64)
    running = seq(10, 0.0)
    scheduler.add(running)
    carry_out(scheduler, scheduler.plan(0.0))
    long = seq(200, 1.0)
    scheduler.add(long)
    chunks = []
    for step in range(6):
        plan = scheduler.plan(1.0 + step)
        assert running in plan.decode, "the running stream decodes at every step"
        assert sum(count for _, count in plan.prefill) + len(plan.decode) <= 64
        chunks += [count for s, count in plan.prefill if s is long]
        carry_out(scheduler, plan)
    assert chunks[:3] == [63, 63, 63] and sum(chunks) >= 199 and long.ready


def test_admission_counts_blocks_after_prefix_hits():
    # 12 blocks: a 160-token prompt needs 10 from scratch; with 128 tokens cached it needs only 2.
    cold, warm = make(blocks=9), make(blocks=9, cached_prefix=128)
    for scheduler in (cold, warm):
        scheduler.add(seq(160, 0.0))
    assert cold.plan(0.0).admitted == []
    assert len(warm.plan(0.0).admitted) == 1


def test_priority_serves_high_first_and_aging_lifts_a_long_waiting_low_over_newcomers():
    policy = ByPriority(aging_seconds=10.0)
    low = seq(10, 0.0, priority=Priority.LOW)
    early_high, late_high = seq(10, 5.0, priority=Priority.HIGH), seq(10, 29.0, priority=Priority.HIGH)
    assert sorted([low, early_high], key=lambda s: policy.key(s, 6.0)) == [early_high, low]
    # 30 s of waiting lifts low by three levels: ahead of a high that has just come
    assert sorted([late_high, low], key=lambda s: policy.key(s, 30.0)) == [low, late_high]


def test_shortest_first_with_aging():
    policy = ShortestFirst(aging_tokens=10.0)
    long = seq(10, 0.0, max_new=500)  # 509 tokens left
    short_early, short_late = seq(10, 10.0, max_new=10), seq(10, 100.0, max_new=10)  # 19 left
    assert sorted([long, short_early], key=lambda s: policy.key(s, 10.0)) == [short_early, long]
    # 100 s of credit (1,000 tokens) puts the long one ahead of a short one that has just come
    assert sorted([short_late, long], key=lambda s: policy.key(s, 100.0)) == [long, short_late]


def test_earliest_deadline_first_and_a_late_request_is_reported_not_dropped():
    scheduler = make(EarliestDeadline(), max_running=1)
    soon, later, none = seq(10, 0.0, deadline=5.0), seq(10, 0.0, deadline=50.0), seq(10, 0.0)
    for s in (none, later, soon):
        scheduler.add(s)
    plan = scheduler.plan(0.0)
    assert plan.admitted == [soon]
    carry_out(scheduler, plan)
    plan = scheduler.plan(6.0)  # past soon's deadline
    assert soon in plan.late and soon in scheduler.running, "late, and still served"
    assert soon.late and not later.late


def test_a_request_whose_tokens_cannot_fit_by_its_deadline_is_late_before_it():
    scheduler = make(EarliestDeadline())
    scheduler.step_seconds = 0.1
    s = seq(10, 0.0, max_new=100, deadline=5.0)  # 100 tokens at 0.1 s a step: 10 s
    scheduler.add(s)
    assert s in scheduler.plan(0.0).late


def test_preemption_when_the_running_set_outgrows_the_pool():
    scheduler = make(blocks=4, max_running=2)
    first, second = seq(31, 0.0), seq(31, 1.0)
    for s in (first, second):
        scheduler.add(s)
    for now in range(3):
        carry_out(scheduler, scheduler.plan(float(now)))
    assert first.ready and second.ready and scheduler.account.obtainable() == 0
    plan = scheduler.plan(3.0)  # both cross into a third block each: 6 > 4
    assert plan.preempted == [second] and plan.decode == [first], "FCFS preempts the latest arrival"
    assert scheduler.waiting == [second] and second.preemptions == 1


def test_priority_preempts_a_running_request_it_outranks():
    scheduler = make(ByPriority(), blocks=3, max_running=4)
    low = seq(40, 0.0, priority=Priority.LOW)
    scheduler.add(low)
    carry_out(scheduler, scheduler.plan(0.0))
    high = seq(40, 1.0, priority=Priority.HIGH)
    scheduler.add(high)
    plan = scheduler.plan(1.0)
    assert plan.preempted == [low] and plan.admitted == [high]


def test_fcfs_never_preempts_for_a_newcomer():
    scheduler = make(FirstCome(), blocks=3)
    old = seq(40, 0.0)
    scheduler.add(old)
    carry_out(scheduler, scheduler.plan(0.0))
    scheduler.add(seq(40, 1.0))
    plan = scheduler.plan(1.0)
    assert plan.preempted == [] and plan.admitted == []


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="fcfs, priority, shortest, deadline"):
        make_policy("random")
    assert make_policy("priority").name == "priority"


def test_a_sequence_preempted_in_a_plan_is_not_admitted_again_by_it():
    """Its blocks count once as freed by the preemption; taken again as its cached prefix they would count twice
    (a lone reply was let go of and read again in one step, its caller's caches emptied)."""
    scheduler = make(blocks=2, cached_prefix=32)
    lone = seq(32, 0.0)
    scheduler.add(lone)
    for now in (0.0, 1.0):  # its prompt is read, its first token decoded: 32 tokens in its 2 blocks
        carry_out(scheduler, scheduler.plan(now))
    assert lone.cached == 32 and scheduler.running == [lone]
    plan = scheduler.plan(2.0)  # its next token needs a third block
    assert plan.preempted == [lone] and plan.admitted == [] and scheduler.waiting == [lone]
    carry_out(scheduler, plan)
    assert scheduler.plan(3.0).admitted == [lone], "it comes back at the next step, its blocks counted once"
