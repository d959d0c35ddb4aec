"""The pace of prompt reading beside decode steps (``pacing.py``): what it grows and shrinks on."""

from __future__ import annotations

import pytest

from mlxcore.batching.pacing import FIRST_WORK, MIN_WORK, REFRESH_STEPS, SHORT_PROMPT, STALL_SHARE, TIMING_STEPS, Pacing
from mlxcore.device_profile import current, forced


def paced(rows_seconds: dict[int, float], layers: int = 6) -> Pacing:
    pacing = Pacing(layers)
    for rows, seconds in rows_seconds.items():
        pacing.observe_decode(rows, seconds)
    return pacing


def test_nothing_is_paced_before_a_decode_step_was_timed():
    pacing = Pacing(6)
    assert pacing.cap() is None
    pacing.observe_feed(4, 16, 0.5)  # no baseline: ignored
    assert pacing.work == FIRST_WORK
    pacing.observe_decode(4, 0.01)
    assert pacing.cap() == pacing.max_tokens


def test_the_pace_grows_by_a_quarter_while_reading_adds_little_and_halves_when_it_adds_too_much():
    pacing = paced({4: 0.010})
    for expected in (20, 25, 31):
        pacing.observe_feed(4, pacing.work, 0.0105)  # 5% added
        assert pacing.work == expected
    pacing.work = 2
    pacing.observe_feed(4, 2, 0.0105)
    assert pacing.work == 3, "a small pace grows by one at least"
    pacing.work, pacing.added = 40, None  # a pace judged afresh
    for _ in range(20):  # every step 1.2 x the share over: the average crosses it, the pace halves once
        pacing.observe_feed(4, pacing.work, 0.010 * (1 + 1.2 * STALL_SHARE))
        if pacing.work < 40:
            break
    assert pacing.work == 20


def test_one_step_far_over_halves_at_once_and_a_step_that_fed_little_says_nothing():
    pacing = paced({4: 0.010})
    pacing.work = 40
    pacing.observe_feed(4, 40, 0.010 * (1 + 2.5 * STALL_SHARE))
    assert pacing.work == 20
    pacing.observe_feed(4, 2, 0.010 * (1 + 1.5 * STALL_SHARE))  # fed a tenth of the pace: no news
    assert pacing.work == 20


def test_each_batch_size_is_judged_against_decode_steps_of_its_own_size_or_the_nearest():
    pacing = paced({2: 0.004, 8: 0.012})
    pacing.work = 40
    pacing.observe_feed(8, 40, 0.0125)  # against 12 ms: a little added, grows
    assert pacing.work == 50
    pacing.observe_feed(7, 50, 0.0125)  # no 7-row steps: against 8 rows'
    assert pacing.work == 62
    assert pacing.decode_seconds(3) == 0.004 and pacing.decode_seconds(5) == 0.004  # ties: the smaller


def test_the_pace_never_exceeds_the_largest_chunk_through_every_layer():
    pacing = paced({1: 0.01}, layers=3)
    for _ in range(50):
        pacing.observe_feed(1, pacing.work, 0.01)
    assert pacing.work == pacing.max_tokens * 3


def test_short_prompts_are_read_at_once_and_long_ones_in_power_of_two_chunks_of_the_pace():
    """``left``: tokens still to read (a chat's history found cached is not among them)."""
    pacing = paced({4: 0.01})
    assert pacing.chunk(20, 20, started=False) == (20, True)
    assert pacing.chunk(SHORT_PROMPT, SHORT_PROMPT, started=False) == (SHORT_PROMPT, True)
    pacing.work = 37
    assert pacing.chunk(SHORT_PROMPT, 300, started=False) == (32, False)
    assert pacing.chunk(20, 30, started=False) == (16, False), "a step's share of a short prompt: paced"
    assert pacing.chunk(5, 5, started=True) == (4, False), "a long prompt's last tokens are paced too"
    pacing.work = 1
    floor = current().min_join_chunk
    assert pacing.chunk(64, 300, started=True) == (min(64, floor), False), "never below the profile's floor"
    assert pacing.chunk(5, 5, started=True) == (4, False), "a prompt's last tokens are fewer"


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_a_paced_chunk_keeps_each_profiles_floor(kind):
    """Whatever the pace, a joining chunk is at least ``min_join_chunk`` tokens (the GPU's floor forced on the CPU)."""
    with forced(kind) as profile:
        pacing = paced({4: 0.01})
        pacing.work = 1
        assert pacing.chunk(profile.join_chunk, 10_000, started=True) == (profile.min_join_chunk, False)
        pacing.work = 10 * profile.join_chunk
        assert pacing.chunk(profile.join_chunk, 10_000, started=True) == (profile.join_chunk, False)


READ_COST = 1e-4  # seconds a token-layer of prompt adds to a step


def joined(refresh: bool, steps: int = 3000) -> tuple[Pacing, float]:
    """4 rows decode while a long prompt is read, driven as the runner drives the pace: a decode step reads
    every token the rows hold (it grows as they do), a step that reads the prompt costs that plus its
    token-layers; with ``refresh``, a step only decodes when ``decode_due`` says so, and is timed."""
    def decode(held: int) -> float:
        return 0.01 + 2e-5 * held

    pacing, rows, held = Pacing(28), 4, 4 * 32
    pacing.observe_decode(rows, decode(held), held)
    for _ in range(steps):
        held += rows
        if refresh and pacing.decode_due(rows, held):
            pacing.observe_decode(rows, decode(held), held)
        else:
            pacing.observe_feed(rows, pacing.work, decode(held) + READ_COST * pacing.work)
    return pacing, decode(held)


def test_the_pace_follows_the_reading_while_the_decoding_rows_grow():
    """Timed only before the join, a decode step grew 20-fold while the prompt was read and the growth
    counted as the reading's: the pace fell to its floor (the 0.6B twin read an 8,000-token prompt at under
    a token a step). Timed again as the rows grow, the pace is what the reading itself costs."""
    (stale, _), (timed, decode_now) = joined(refresh=False), joined(refresh=True)
    assert stale.work == MIN_WORK
    assert timed.decode_seconds(4) > 15 * 0.0126, "the decode step's time follows the rows"
    added = READ_COST * timed.work / decode_now
    assert 0.2 < added < 1.5 * STALL_SHARE, f"reading adds about the stall share of a step ({added:.2f})"
    assert timed.work < timed.max_tokens * timed.layers, "(the pace's own bound did not decide it)"


def test_a_decode_step_is_timed_again_once_in_a_while_and_never_right_after_a_step_that_read():
    pacing = Pacing(28)
    pacing.observe_decode(4, 0.010, 400)
    for _ in range(REFRESH_STEPS - 1):
        pacing.observe_feed(4, pacing.work, 0.011)
    assert not pacing.decode_due(4, 1000), "too soon after the last time"
    pacing.observe_feed(4, pacing.work, 0.011)
    assert not pacing.decode_due(4, 450), "the rows grew less than a quarter"
    assert pacing.decode_due(4, 600)
    pacing.observe_decode(4, 0.5, 600)  # right after a step that read: the previous pass's time
    assert pacing.decode_seconds(4) == 0.010
    assert pacing.decode_due(4, 604)
    pacing.observe_decode(4, 0.016, 604)
    assert pacing.decode_seconds(4) == 0.016, "grown a quarter: a new cost, not averaged with the old"
    assert not pacing.decode_due(4, 608), "timed: the steps read again"


def test_a_due_time_gives_up_after_a_few_steps_when_none_could_be_timed():
    """(A step that starts reading a new prompt is not a decode step's time; the reading waits a few steps
    at most.)"""
    pacing = Pacing(28)
    pacing.observe_decode(4, 0.010, 100)
    for _ in range(REFRESH_STEPS):
        pacing.observe_feed(4, pacing.work, 0.011)
    assert [pacing.decode_due(4, 1000) for _ in range(TIMING_STEPS + 1)] == [True] * TIMING_STEPS + [False]
