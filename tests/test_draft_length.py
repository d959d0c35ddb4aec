"""The adaptive draft length: drafts when it pays, falls back to plain decoding when it does not, probes again."""

import random

import pytest

from mlxcore.draft_length import DraftLengthController
from bench.draft_lengths import FixedDraftLength


def run(controller, rounds, plain_seconds, per_draft_seconds, accepts, round_overhead=0.0, catch_up_seconds=0.0,
        round_catch_up=0.0):
    """Feed the controller a simulated machine.

    A plain step costs P; a round of k costs P + overhead + c k (its drafts take
    c k, timed when the controller asks); ``accepts(k)`` drafts are kept. Before a
    round after plain steps, the draft is fed the tokens it missed, ``catch_up_seconds`` each;
    after each round, the two a round leaves it short of, in ``round_catch_up`` seconds.
    """
    chosen, missed = [], 0
    for _ in range(rounds):
        k = controller.choose()
        chosen.append(k)
        if k == 0:
            controller.observe_plain(plain_seconds)
            missed += 1
        else:
            if missed > 1:
                controller.observe_catch_up(missed, missed * catch_up_seconds)
            missed = 0
            timed = controller.draft_timing_due()
            controller.observe_round(k, accepts(k), plain_seconds + round_overhead + per_draft_seconds * k,
                                     per_draft_seconds * k if timed else None)
            if round_catch_up:
                controller.observe_catch_up(2, round_catch_up)
    return chosen


def test_cheap_draft_that_agrees_gets_long_drafts():
    chosen = run(DraftLengthController(max_k=8), 60, 0.004, 0.0004, lambda k: k)
    assert chosen[0] == 0  # the baseline is measured first
    assert all(k == 8 for k in chosen[-20:])


def test_draft_that_never_agrees_falls_back_to_plain_and_probes():
    controller = DraftLengthController(max_k=8, probe_every=24)
    chosen = run(controller, 200, 0.004, 0.001, lambda k: 0)
    tail = chosen[50:]
    assert tail.count(0) > 0.9 * len(tail)
    assert any(k > 0 for k in tail)  # it keeps probing, so a draft that improves is noticed


def test_expensive_draft_is_not_used_even_when_it_agrees():
    chosen = run(DraftLengthController(max_k=8), 100, 0.004, 0.0045, lambda k: k)
    assert chosen[-30:].count(0) >= 25


def test_moderate_acceptance_picks_a_middle_length():
    """Acceptance 0.6 per position, drafts at 15% of a step: the best k is small but not zero."""
    import random
    rng = random.Random(0)

    def accepts(k):
        n = 0
        while n < k and rng.random() < 0.6:
            n += 1
        return n

    chosen = run(DraftLengthController(max_k=8), 400, 0.004, 0.0006, accepts)
    settled = chosen[-100:]
    assert 1 <= sorted(settled)[len(settled) // 2] <= 4


def test_a_position_that_looked_bad_early_is_drafted_again_and_long_drafts_come_back():
    """Early on the draft's second guess is always wrong (a reply's first words), later every guess is right: the
    second position's acceptance is only learned by drafting it, so the controller must go past k = 1 to see it."""
    def climb(controller):
        run(controller, 40, 0.004, 0.0004, lambda k: min(k, 1))
        assert controller.choose() == 1 and controller.accept[1] < 0.5
        return run(controller, 300, 0.004, 0.0004, lambda k: k)

    settled = climb(DraftLengthController(max_k=8))[-40:]
    assert set(settled) <= {0, 8} and settled.count(8) >= 39  # (a plain step now and then re-measures P)
    stuck = climb(DraftLengthController(max_k=8, explore_every=10**9))  # (never exploring: the old controller)
    assert set(stuck[-40:]) <= {0, 1}


def test_fixed_length_is_kept():
    assert set(run(FixedDraftLength(3, max_k=8), 20, 0.004, 0.001, lambda k: 0)) == {3}


@pytest.mark.parametrize("catch_up, probes", [(0.0002, True), (0.002, False)])
def test_a_draft_whose_catch_up_costs_too_much_is_not_probed_again(catch_up, probes):
    """Feeding the draft what it missed costs C a token (a hybrid draft reading on a CPU: a sizeable share of a
    target step): past ``probe_budget`` of a plain step, a draft that stopped paying is not probed again."""
    controller = DraftLengthController(max_k=8, probe_every=24)
    chosen = run(controller, 800, 0.004, 0.001, lambda k: 0, catch_up_seconds=catch_up)
    assert any(k > 0 for k in chosen[200:]) == probes


def test_a_rounds_own_short_catch_ups_do_not_stop_probes():
    """The one or two tokens a round leaves the draft short of cost it about a pass's fixed time (over the budget
    per token); only catch-ups as long as a probe's say what a probe costs. A draft that agreed, then stops
    agreeing, is still probed when its long catch-ups are cheap."""
    controller = DraftLengthController(max_k=8, probe_every=24)
    run(controller, 200, 0.004, 0.0004, lambda k: k, round_catch_up=0.004)
    chosen = run(controller, 800, 0.004, 0.001, lambda k: 0, catch_up_seconds=0.0002, round_catch_up=0.004)
    assert any(k > 0 for k in chosen[200:])


def test_a_probe_drafts_one_token():
    """A draft that stopped paying is probed with the cheapest round: one draft, whose acceptance (the first
    position's) is what decides whether any k pays. (Rounds that cost a step more than their drafts, as a
    synchronised round does: a probe of the best k drafted 6 or 7 here.)"""
    controller = DraftLengthController(max_k=8, probe_every=24)
    chosen = run(controller, 600, 0.004, 0.0004, lambda k: 0, round_overhead=0.004)
    probes = [k for k in chosen[50:] if k > 0]
    assert probes and set(probes) == {1}


def test_failed_probes_back_off():
    """A draft that never agrees: probes come less and less often, up to the cap."""
    controller = DraftLengthController(max_k=8, probe_every=24, max_probe_every=384)
    chosen = run(controller, 3000, 0.004, 0.001, lambda k: 0)
    probes = [i for i, k in enumerate(chosen) if k > 0 and i > 50]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] >= 384 and gaps[0] < 100
    assert chosen[-1000:].count(0) > 0.99 * 1000


def test_probe_that_pays_brings_drafting_back():
    """The text changes: a draft that never agreed starts agreeing, and the next probe notices."""
    controller = DraftLengthController(max_k=8)
    run(controller, 1000, 0.004, 0.0004, lambda k: 0)
    chosen = run(controller, 800, 0.004, 0.0004, lambda k: k)
    assert chosen[-50:].count(0) <= 2


def test_round_overhead_is_not_charged_to_the_drafts():
    """Rounds cost a fixed extra (a synchronised verify pass): a cheap, agreeing draft still gets long drafts."""
    controller = DraftLengthController(max_k=8)
    chosen = run(controller, 200, 0.004, 0.0005, lambda k: k, round_overhead=0.004)
    assert chosen[-50:].count(8) >= 49  # and at most one plain step that re-measures P
    assert abs(controller.per_draft - 0.0005) < 1e-9 and abs(controller.round_fixed - 0.008) < 1e-9


class FixedTimings(DraftLengthController):
    time_draft_every = 10  # rounds between two timings of the draft passes (the engine's: 32)


def test_draft_passes_are_timed_now_and_then():
    controller = FixedTimings(max_k=4)
    timed = 0
    for _ in range(100):
        k = controller.choose()
        if k == 0:
            controller.observe_plain(0.004)
            continue
        due = controller.draft_timing_due()
        timed += due
        controller.observe_round(k, k, 0.006, 0.001 * k if due else None)
    assert 5 <= timed <= 12


def test_a_new_batch_size_starts_from_what_the_nearest_size_learned():
    """Acceptance is the pair's and the text's, whatever the batch: a batch size seen for the first time starts
    from the nearest size's (and its draft pass's time), so after measuring its own plain step it neither
    drafts a draft known to lose (a fresh start measured two rounds, then drafted on optimistic estimates) nor
    waits to draft one known to win."""
    losing = DraftLengthController(max_k=8, probe_every=24)
    run(losing, 300, 0.004, 0.0004, lambda k: 0, round_overhead=0.004)
    fresh = DraftLengthController(max_k=8).for_rows(4)  # nothing learned anywhere
    assert run(fresh, 6, 0.006, 0.0005, lambda k: 0, round_overhead=0.006) == [0, 0, 0, 4, 4, 8]
    batch = losing.for_rows(4)
    assert run(batch, 40, 0.006, 0.0005, lambda k: 0, round_overhead=0.006) == [0] * 40
    winning = DraftLengthController(max_k=8)
    run(winning, 100, 0.004, 0.0004, lambda k: k)
    assert run(winning.for_rows(4), 5, 0.006, 0.0005, lambda k: k) == [0, 0, 0, 8, 8]
    assert winning.for_rows(4) is winning.for_rows(4) and winning.for_rows(1) is winning


def test_a_draft_lengths_first_round_is_not_its_time():
    """A draft length's first round traces its passes anew (mx.compile, for a new row count): timed, the trace
    made a draft that pays look slow, and the controller decoded plainly, probing now and then."""
    controller, traced, chosen = DraftLengthController(max_k=8), set(), []
    for _ in range(80):
        k = controller.choose()
        chosen.append(k)
        if k == 0:
            controller.observe_plain(0.004)
            continue
        trace = 0.0 if k in traced else 0.05
        traced.add(k)
        timed = controller.draft_timing_due()
        controller.observe_round(k, k, 0.006 + 0.0004 * k + trace, 0.0004 * k + trace if timed else None)
    assert chosen[-20:].count(8) >= 19


def test_the_plain_baseline_is_several_steps_not_one():
    """Rounds re-measure the plain step only now and then (``refresh_every``), so a baseline of one plain step
    lasts: one slow step (a join's, a trace's) made a draft that loses look as if it paid. The baseline is the
    median of the first few; here the first step is five times the others, and rounds of any k lose."""
    controller = DraftLengthController(max_k=8)
    steps = iter([0.020] + [0.004] * 100)
    chosen = []
    for _ in range(60):
        k = controller.choose()
        chosen.append(k)
        if k == 0:
            controller.observe_plain(next(steps))
        else:  # a round costs two plain steps and a draft pass a token; half its drafts are kept
            controller.observe_round(k, k // 2, 0.008 + 0.003 * k, 0.003 * k if controller.draft_timing_due() else None)
    assert chosen[:3] == [0, 0, 0]
    assert chosen[3:].count(0) >= 50, "a draft that loses is left after the rounds that measure it"


def realized(seed: int, accept: float, round_base: float, round_per_k: float,
             steps: int = 1500) -> tuple[float, list[int]]:
    """Simulated machine: a plain step costs 0.004 s for one token; a round of k costs round_base + round_per_k k,
    of which its draft passes (the part timed as drafting) are 0.0004 k, the rest the verification's k + 1 rows
    and the round's sync; each drafted token is kept with probability ``accept`` while the ones before it were.
    Returns the tokens a second after the first 200 steps, as a multiple of plain decoding's, and the k chosen."""
    rng = random.Random(seed)
    controller = DraftLengthController(max_k=8)
    seconds = tokens = 0.0
    chosen = []
    for step in range(steps):
        k = controller.choose()
        if k == 0:
            controller.observe_plain(0.004)
            spent, made = 0.004, 1
        else:
            kept = next((i for i in range(k) if rng.random() > accept), k)
            spent = round_base + round_per_k * k
            controller.observe_round(k, kept, spent, 0.0004 * k if controller.draft_timing_due() else None)
            made = kept + 1
        if step >= 200:
            seconds, tokens = seconds + spent, tokens + made
            chosen.append(k)
    return tokens / seconds * 0.004, chosen


@pytest.mark.parametrize("seed", range(3))
def test_a_verification_dearer_with_k_is_not_drafted_at_a_loss(seed):
    """On a CPU a verification's k + 1 rows a reply cost about as many rows of products, which the draft passes'
    timing does not see. Here no k pays (a round of k costs 0.005 + 0.004 k: k = 1 makes 1.9 tokens in 9 ms
    against 2.25 plain). With a round's fixed part taken as flat in k, a probe of one draft measured it small and
    made k = 8 look cheap: rounds of 8 at a loss after every probe (0.90-0.91 of plain here); fitted in k, the
    probes and the rounds after them tell the line, and the controller stays plain."""
    rate, chosen = realized(seed, 0.9, 0.005, 0.004)
    assert rate >= 0.99
    assert chosen.count(8) == 0


@pytest.mark.parametrize("seed", range(4))
def test_a_verification_dearer_with_k_drafts_the_length_that_pays(seed):
    """Where drafting pays (each token kept with probability 0.95, a round of k costs 0.004 + 0.0022 k), the best
    lengths are the middle ones (3 to 5: 1.40-1.41 times plain by expectation; 2 and 8: 1.36-1.37). Flat in k,
    the controller drafted 8 (whose measured round made every shorter one look as dear), or after one unlucky
    round of 8 stayed plain for good (1.00, 1.35-1.38 over these seeds); fitted, it drafts the middle lengths."""
    rate, chosen = realized(seed, 0.95, 0.004, 0.0022)
    assert rate >= 1.35
    assert sum(chosen.count(k) for k in range(2, 6)) >= 0.8 * len(chosen)  # (the rest: probes, explorations)
