"""The adaptive draft length: drafts when it pays, falls back to plain decoding when it does not, probes again."""

from mlxcore.draft_length import DraftLengthController


def run(controller, rounds, plain_seconds, per_draft_seconds, accepts):
    """Feed the controller a simulated machine: a round of k costs P + c k; `accepts(k)` drafts are kept."""
    chosen = []
    for _ in range(rounds):
        k = controller.choose()
        chosen.append(k)
        if k == 0:
            controller.observe_plain(plain_seconds)
        else:
            controller.observe_round(k, accepts(k), plain_seconds + per_draft_seconds * k)
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


def test_fixed_length_is_kept():
    assert set(run(DraftLengthController(max_k=8, fixed=3), 20, 0.004, 0.001, lambda k: 0)) == {3}
