"""Speculative decoding: greedy output equals plain greedy output; caches exact at every stop; p is preserved.

Token equality holds here because MLX's CPU backend rounds a product of one row (a plain step) as it rounds the same
row among k+1 (a verification block); on Metal the kernels differ by shape (docs/internals.md, "What is exact on which
device").
"""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from mlxcore.draft_length import DraftLengthController
from bench.draft_lengths import FixedDraftLength
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.params import GenerationParams
from mlxcore.sampling import distribution
from mlxcore.params import SamplingParams
from tiny_models import tiny_qwen3

KINDS = [KVConfig(kind="standard"), KVConfig(kind="paged", block_size=8), KVConfig(kind="rotating", max_kv=48)]


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(seed=3, vocab_size=512)


@pytest.fixture(scope="module")
def drafts(target):
    """A draft that agrees (the target itself), one that mostly disagrees (untrained, 1 layer)."""
    return {"agrees": target, "disagrees": tiny_qwen3(seed=5, vocab_size=512, layers=1)}


class ScriptedK(DraftLengthController):
    """Cycles through draft lengths with plain runs (k = 0) between rounds: every transition is exercised."""

    SCRIPT = (0, 0, 3, 0, 1, 1, 0, 0, 0, 5, 2, 0)
    time_draft_every = 2  # rounds between two timings of the draft passes

    def __init__(self):
        super().__init__(max_k=max(self.SCRIPT))
        self.step = 0

    def choose(self):
        self.step += 1
        return self.SCRIPT[(self.step - 1) % len(self.SCRIPT)]


def controller(k):
    """Always k (so tests exercise every round shape), or the script above."""
    return ScriptedK() if k == "scripted" else FixedDraftLength(k, time_draft_every=2)


def run(engine, prompt, n, caches=None, **params):
    caches = caches or engine.new_caches()
    events = list(engine.generate(prompt, caches, GenerationParams(max_tokens=n, **params)))
    return [e.token for e in events if isinstance(e, TokenEvent)], caches, events


def prompt_of(seed, length=20):
    return np.random.default_rng(seed).integers(0, 512, length).tolist()


@pytest.mark.parametrize("kv", KINDS, ids=lambda kv: kv.kind)
@pytest.mark.parametrize("which", ["agrees", "disagrees"])
@pytest.mark.parametrize("k", [None, 1, 5, "scripted"])
def test_greedy_speculative_equals_plain(target, drafts, kv, which, k):
    """Long enough to cross many 8-token blocks and to wrap the 48-token window several times."""
    plain = Engine(target, None, kv=kv)
    spec = Engine(target, None, kv=kv, draft_model=drafts[which])
    if k:
        spec.draft_control = controller(k)
    prompt = prompt_of(1)
    expected = run(plain, prompt, 160)[0]
    tokens, caches, events = run(spec, prompt, 160)
    assert tokens == expected
    assert caches.target.offset == len(prompt) + 160
    if isinstance(k, int):  # every step a round: the draft is fed the last token too
        assert caches.draft.offset == caches.target.offset
    if kv.kind != "rotating":
        assert caches.tokens == prompt + tokens
        assert caches.draft.offset <= caches.target.offset  # the draft holds a start of the same ids
    stats = events[-1].stats
    if which == "agrees" and k and k != "scripted":
        assert stats.draft_accepted == stats.draft_proposed > 0
        assert any(e.from_draft for e in events[:-1])


@pytest.mark.parametrize("kv", KINDS, ids=lambda kv: kv.kind)
@pytest.mark.parametrize("k", [4, "scripted"])
def test_stopping_at_any_event_leaves_both_caches_exact(target, drafts, kv, k):
    """The target holds exactly what was taken; the draft too when every step drafts, else a prefix (a draft
    left behind by plain steps is caught up at its next round, not fed at every stop)."""
    spec = Engine(target, None, kv=kv, draft_model=drafts["agrees"])
    spec.draft_control = controller(k)
    prompt = prompt_of(2)
    for stop_after in range(1, 25):
        caches = spec.new_caches()
        seen = []
        for event in spec.generate(prompt, caches, GenerationParams(max_tokens=40)):
            seen.append(event.token)
            if len(seen) == stop_after:
                break
        assert caches.target.offset == len(prompt) + stop_after, stop_after
        if isinstance(k, int):  # every step a round: the draft is fed what the target holds
            assert caches.draft.offset == caches.target.offset
        if kv.kind != "rotating":
            assert caches.tokens == prompt + seen
            assert caches.draft.offset <= caches.target.offset  # the draft holds a start of the same ids


def test_eos_stop_leaves_caches_exact(target, drafts):
    spec = Engine(target, None, kv=KVConfig(kind="paged", block_size=8), draft_model=drafts["agrees"])
    spec.draft_control = controller(6)
    prompt = prompt_of(3)
    reference = run(Engine(target, None), prompt, 30)[0]
    spec.eos_ids = {reference[9]}
    tokens, caches, events = run(spec, prompt, 30)
    assert tokens == reference[: reference.index(reference[9]) + 1]
    assert events[-1].finish_reason == "eos"
    assert caches.tokens == prompt + tokens and caches.draft.offset == caches.target.offset


def test_next_turn_after_speculative_turn_reuses_both_caches(target, drafts):
    spec = Engine(target, None, kv=KVConfig(kind="paged", block_size=8), draft_model=drafts["disagrees"])
    prompt = prompt_of(4)
    first, caches, _ = run(spec, prompt, 25)
    follow = prompt + first + prompt_of(5, 6)
    second, caches, events = run(spec, follow, 25, caches=caches)
    assert events[-1].stats.reused_tokens == len(prompt) + len(first)
    assert second == run(Engine(target, None), follow, 25)[0]


def test_sampled_first_token_follows_the_target_distribution(target, drafts):
    """1,500 seeded replies of one token drafted with k = 3 by a disagreeing draft: chi-square p > 0.001."""
    spec = Engine(target, None, kv=KVConfig(kind="standard"), draft_model=drafts["disagrees"])
    spec.draft_control = controller(3)
    prompt = prompt_of(6, 8)
    params = SamplingParams(temperature=0.8)
    logits = target(mx.array([prompt]))[0, -1]
    p = np.array(distribution(logits, params), dtype=np.float64)
    p /= p.sum()
    counts = np.zeros_like(p)
    for seed in range(1500):
        tokens = run(spec, prompt, 1, temperature=0.8, seed=seed)[0]
        counts[tokens[0]] += 1
    big = p * counts.sum() >= 5  # chi-square needs expected counts of 5 or more: pool the rest
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(p[big], p[~big].sum()) * counts.sum()
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)
