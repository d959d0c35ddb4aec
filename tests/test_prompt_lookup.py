"""Prompt lookup (``mlxcore/prompt_lookup.py``): draft tokens found in the reply's own text, verified as rows of
the step's pass. Greedy replies equal plain greedy's, alone on every cache and side by side; sampled tokens
follow the target's distribution (rejection sampling against a certain proposal).

Token equality holds on MLX's CPU backend (docs/internals.md, "What is exact on which device").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from app.tui.widgets.status_line import stats_text
from bench.draft_lengths import FixedDraftLength
from bench.side_by_side import side_by_side
from mlxcore.batching.drafters import LookupChoice, LookupFirst
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.params import GenerationParams, SamplingParams
from mlxcore.prompt_lookup import NgramIndex
from mlxcore.sampling import distribution
from tiny_models import tiny_qwen3

KINDS = [KVConfig(kind="paged", block_size=8), KVConfig(kind="standard"), KVConfig(kind="rotating", max_kv=48)]


def test_the_longest_earlier_match_proposes_what_followed_its_latest_occurrence():
    index = NgramIndex()
    ids = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    assert index.propose(ids, 2) == [4, 9], "the 3-gram [1, 2, 3] occurred before: the longest match wins"
    assert NgramIndex().propose(ids[:-3] + [8, 2, 3], 2) == [5, 6], "[2, 3] last ended before 5, 6"
    assert index.propose(ids + [4, 8], 3) == [], "nothing ends with [4, 8] before"
    assert index.propose([5, 5], 4) == [], "a match needs an earlier occurrence"
    assert index.propose([5, 5, 5], 4) == [5], "the continuation stops where the text does"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40))
def test_an_index_grown_token_by_token_proposes_as_one_built_at_once(ids):
    grown = NgramIndex()
    for end in range(1, len(ids) + 1):
        grown.propose(ids[:end], 5)
    assert grown.propose(ids, 5) == NgramIndex().propose(ids, 5)


def looping_prompt(seed: int) -> list[int]:
    """A prompt that repeats itself, as a file quoted and then edited would."""
    part = np.random.default_rng(seed).integers(0, 512, 12).tolist()
    return part + [7, 8] + part + part[:5]


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(seed=3, vocab_size=512)


def engine(target, kv: KVConfig, lookup: bool, k: int | None = 4) -> Engine:
    made = Engine(target, None, kv=kv, prompt_lookup=lookup)
    if lookup and k is not None:
        made.draft_control = FixedDraftLength(k)
    return made


def reply(made: Engine, prompt: list[int], params: GenerationParams) -> tuple[list[int], FinalEvent]:
    events = list(made.generate(prompt, made.new_caches(), params))
    assert isinstance(events[-1], FinalEvent)
    return [e.token for e in events if isinstance(e, TokenEvent)], events[-1]


@pytest.mark.parametrize("kv", KINDS, ids=lambda kv: kv.kind)
@pytest.mark.parametrize("k", [2, 6, None], ids=["k2", "k6", "adaptive"])
def test_greedy_with_prompt_lookup_equals_plain(target, kv, k):
    params = GenerationParams(max_tokens=40)
    for seed in range(3):
        prompt = looping_prompt(seed)
        tokens, final = reply(engine(target, kv, True, k), prompt, params)
        assert tokens == reply(engine(target, kv, False), prompt, params)[0]
        if k is not None:
            assert final.stats.draft_proposed > 0, "the repeated prompt gave proposals"


def test_replies_side_by_side_with_prompt_lookup_equal_each_alone(target):
    made = engine(target, KVConfig(kind="paged", block_size=8), True, 4)
    params = GenerationParams(max_tokens=30)
    prompts = [looping_prompt(seed) for seed in range(3)] + [np.random.default_rng(9).integers(0, 512, 20).tolist()]
    batch, replies = side_by_side(made, prompts, params)
    assert batch.runner.tally.largest_batch == 4
    plain = engine(target, KVConfig(kind="paged", block_size=8), False)
    for prompt, got in zip(prompts, replies):
        assert [e.token for e in got if isinstance(e, TokenEvent)] == reply(plain, prompt, params)[0]
    assert sum(got[-1].stats.draft_accepted for got in replies) > 0


def test_sampled_tokens_after_a_lookup_follow_the_target_distribution(target):
    """1,500 seeded one-token replies to a prompt whose last tokens occurred before (every first token is a
    proposal's verdict): their counts against the target's distribution, chi-square p > 0.001."""
    made = engine(target, KVConfig(kind="paged", block_size=8), True, 3)
    prompt = looping_prompt(4)
    p = np.array(distribution(target(mx.array([prompt]))[0, -1], SamplingParams(temperature=0.8)), dtype=np.float64)
    p /= p.sum()
    counts = np.zeros_like(p)
    for seed in range(1500):
        tokens, final = reply(made, prompt, GenerationParams(max_tokens=1, temperature=0.8, seed=seed))
        assert final.stats.draft_proposed == 3
        counts[tokens[0]] += 1
    big = p * counts.sum() >= 5  # chi-square needs expected counts of 5 or more: pool the rest
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(p[big], p[~big].sum()) * counts.sum()
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)


def test_ask_draft_lookup_says_which_drafter_ran_and_the_status_line_names_it(tmp_path):
    """`mlxchat ask --draft lookup --json`, as users run it: the final stats name the drafter; the window's
    status line shows its acceptance under that name."""
    done = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--json", "--draft", "lookup", "--max-tokens", "40",
                           "What is 12 times 9?"], cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.strip().splitlines()[-1])["stats"]
    assert stats["drafter"] == "lookup" and stats["draft_lengths"], stats
    line = stats_text({**stats, "acceptance": 0.5, "draft_proposed": 4})
    assert "lookup 50%" in line


def test_lookup_beside_a_draft_model_drafts_with_both_and_equals_plain(target):
    """``LookupFirst`` (the default beside a drafter): replies whose text repeats take lookup's proposals, the
    others the draft model's, in the same rounds; greedy tokens equal plain greedy's, side by side."""
    draft = tiny_qwen3(seed=5, vocab_size=512, layers=1)
    made = Engine(target, None, kv=KVConfig(kind="paged", block_size=8), draft_model=draft, prompt_lookup=True)
    made.draft_control = FixedDraftLength(3)
    params = GenerationParams(max_tokens=30)
    prompts = [looping_prompt(seed) for seed in range(2)] + [np.random.default_rng(9).integers(0, 512, 20).tolist()]
    batch, replies = side_by_side(made, prompts, params)
    plain = engine(target, KVConfig(kind="paged", block_size=8), False)
    for prompt, got in zip(prompts, replies):
        assert [e.token for e in got if isinstance(e, TokenEvent)] == reply(plain, prompt, params)[0]
        assert got[-1].stats.drafter == "draft model+lookup"
    rounds = batch.runner.drafter.rounds
    assert rounds["lookup"] > 0 and rounds["draft model"] > 0, f"both drafters proposed: {rounds}"


def test_lookup_that_falls_behind_the_other_drafter_is_only_probed():
    choice = LookupChoice()
    assert choice.takes_lookup(), "untried, lookup is taken"
    choice.lookup.add(4, 0)
    choice.other.add(4, 3)
    taken = [choice.takes_lookup() for _ in range(2 * LookupChoice.PROBE_EVERY)]
    assert taken.count(True) == 2 and taken[LookupChoice.PROBE_EVERY - 1], taken
    for _ in range(3):
        choice.lookup.add(4, 4)
    assert choice.takes_lookup(), "measured ahead again, lookup is taken every time"


def test_sampled_tokens_side_by_side_with_lookup_beside_a_draft_follow_the_target(target):
    """``LookupFirst`` in a batch, sampled: each seed runs two one-token replies side by side, one whose
    prompt repeats (lookup's proposal) and one whose prompt does not (the draft model's), in one round; each
    reply's first tokens against the target's distribution, chi-square p > 0.001."""
    draft = tiny_qwen3(seed=5, vocab_size=512, layers=1)
    made = Engine(target, None, kv=KVConfig(kind="paged", block_size=8), draft_model=draft, prompt_lookup=True)
    made.draft_control = FixedDraftLength(3)
    prompts = [looping_prompt(4), np.random.default_rng(9).integers(0, 512, 20).tolist()]
    params = SamplingParams(temperature=0.8)
    expected = [np.array(distribution(target(mx.array([p]))[0, -1], params), dtype=np.float64) for p in prompts]
    counts = [np.zeros(512), np.zeros(512)]
    for seed in range(800):
        batch, replies = side_by_side(made, prompts, GenerationParams(max_tokens=1, temperature=0.8, seed=seed))
        for count, got in zip(counts, replies):
            count[[e.token for e in got if isinstance(e, TokenEvent)][0]] += 1
    assert batch.runner.drafter.rounds["lookup"] > 0, "the repeating reply took lookup's proposal"
    assert batch.runner.drafter.rounds["draft model"] > 0, "the other reply drafted with the model"
    for p, count in zip(expected, counts):
        p /= p.sum()
        big = p * count.sum() >= 5  # chi-square needs expected counts of 5 or more: pool the rest
        observed = np.append(count[big], count[~big].sum())
        assert chisquare(observed, np.append(p[big], p[~big].sum()) * count.sum()).pvalue > 1e-3, observed


def test_a_model_opened_without_a_drafter_looks_up_by_default_unless_told_not_to(tmp_path):
    """``open_engine``: a model alone drafts by prompt lookup; ``--no-draft`` turns it off; a hybrid model
    (its layers run whole, not as rows) does not look up."""
    from mlxcore.launch import open_engine
    from mlxcore.configs import ModelChoice
    from tiny_models import tiny_hybrid, tiny_hybrid_config, write_model_folder

    alone = open_engine(ModelChoice(model="mini-target"))
    assert alone.engine.prompt_lookup and alone.engine.draft_name == "lookup"
    assert not open_engine(ModelChoice(model="mini-target", no_draft=True)).engine.prompt_lookup
    root = Path(__file__).resolve().parent.parent / "assets" / "models"
    hybrid = write_model_folder(tiny_hybrid(), tmp_path / "tiny-hybrid", root / "mini-target", config=tiny_hybrid_config())
    opened = open_engine(ModelChoice(model=str(hybrid)))
    assert not opened.engine.prompt_lookup and not opened.engine.draft_name


def test_lookup_a_little_behind_a_costly_drafter_is_still_taken():
    """Lookup's proposal costs no pass: at 90% against the other drafter's 100%, it is taken when the other's
    passes are half of a round of 4 (more tokens a second), not when they cost nothing."""
    choice = LookupChoice()
    for _ in range(5):
        choice.lookup.add(10, 9)
        choice.other.add(10, 10)
    assert not choice.takes_lookup(4, share=1.0)
    assert choice.takes_lookup(4, share=0.5)


def test_a_new_reply_starts_from_what_the_replies_before_it_measured():
    class Other:
        name, samples, keeps, forward, vocab = "draft", True, (), None, 512

    class Reply:  # stands for a reply's SpeculativeDecoder (a key of the choices)
        pass

    chooser = LookupFirst(Other())
    first = chooser.choice(Reply())
    assert first.takes_lookup(4), "untried, lookup is taken"
    for _ in range(5):
        chooser.learned.lookup.add(4, 0)
        chooser.learned.other.add(4, 4)
    later = chooser.choice(Reply())
    assert not later.takes_lookup(4) and first.takes_lookup(4), "the new reply learned; the first kept its own"
