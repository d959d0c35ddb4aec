"""Speculative decoding inside the batch (``mlxcore/batching/spec_rows.py``): replies side by side draft, and each
reply's tokens equal the same request decoded alone without a draft (greedy), or follow the target's
distribution (sampled).

Token equality holds on MLX's CPU backend, which rounds a row of a product the same whatever the rows beside
it; on Metal kernels differ by shape (docs/internals.md, "What is exact on which device").
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from bench.batch_load import stream_prompt
from bench.draft_lengths import FixedDraftLength
from mlxcore.batching import batch_mirror
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams, SamplingParams
from mlxcore.sampling import distribution
from tiny_models import tiny_qwen3

TARGET, DRAFT = load_model("mini-target"), load_model("mini-draft")
VOCAB = TARGET.model.args.vocab_size
GREEDY = GenerationParams(max_tokens=24)


def engine(draft=None, k: int | None = 4, block_size: int = 16) -> Engine:
    made = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged", block_size=block_size),
                  draft_model=draft)
    made.eos_ids = set()  # replies run to max_tokens: long enough to cross steps and blocks
    if draft is not None and k is not None:
        made.draft_control = FixedDraftLength(k)  # a round every step (the adaptive length follows timings)
    return made


def alone(prompt: list[int], params: GenerationParams) -> list[int]:
    plain = engine()
    return [e.token for e in plain.generate(prompt, plain.new_caches(), params) if isinstance(e, TokenEvent)]


def run(batch: LocalBatch, requests: list[Request], join_after: int = 0) -> list[list[TokenEvent | FinalEvent]]:
    """Each request's events; the last request joins after ``join_after`` steps."""
    handles = [batch.submit(r)[0] for r in requests[:-1]] if join_after else []
    events: dict[str, list] = {}
    for _ in range(join_after):
        batch.step()
    handles += [batch.submit(r)[0] for r in requests[len(handles):]]
    while batch.busy:
        batch.step()
        for handle in handles:
            events.setdefault(handle.request_id, []).extend(drain(handle))
    for handle in handles:
        events.setdefault(handle.request_id, []).extend(drain(handle))
    return [events[h.request_id] for h in handles]


def tokens(events) -> list[int]:
    return [e.token for e in events if isinstance(e, TokenEvent)]


@pytest.mark.parametrize("k", [1, 4, None], ids=["k1", "k4", "adaptive"])
@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_replies_drafting_side_by_side_equal_each_alone_without_a_draft(k, which):
    """Four replies of different prompt lengths, one joining later: every token as alone, and the rounds
    ran in the batch (a draft that agrees, and one that proposes at random)."""
    draft = DRAFT.model if which == "trained" else tiny_qwen3(seed=5, vocab_size=VOCAB, layers=1)
    batch = LocalBatch(engine(draft, k))
    prompts = [stream_prompt(VOCAB, s, 9 + 23 * s) for s in range(4)]
    got = run(batch, [Request(tuple(p), GREEDY) for p in prompts], join_after=6)
    assert batch.runner.tally.largest_batch == 4
    for p, events in zip(prompts, got):
        assert tokens(events) == alone(p, GREEDY)
    if k is not None:
        stats = [e.stats for e in (events[-1] for events in got)]
        assert all(s.draft_proposed > 0 for s in stats), "every reply drafted beside the others"
        if which == "untrained":
            assert sum(s.draft_accepted for s in stats) < sum(s.draft_proposed for s in stats) / 2


def test_the_drafts_later_passes_are_its_batchs_decode_rows_read_from_its_mirror(monkeypatch):
    """Replies side by side draft their tokens after the first as decode rows of the draft's batch, read from
    the draft pool's mirror (one attention a layer for them all, not one a reply), and each round copies into
    it only what the draft read since (not the reply); once nothing decodes its bytes go back."""
    mirrors: dict[int, list] = {}  # id of a mirror's pool -> each plan's copied tokens
    plan = batch_mirror.BatchMirror.plan

    def recording(self, caches):
        made = plan(self, caches)
        mirrors.setdefault(id(self.pool), []).append(sum(cache.offset - start for cache, start, _ in made.fills))
        return made
    monkeypatch.setattr(batch_mirror.BatchMirror, "plan", recording)
    made = engine(DRAFT.model, 4)
    batch = LocalBatch(made)
    prompts = [stream_prompt(VOCAB, s, 30 + 11 * s) for s in range(3)]
    got = run(batch, [Request(tuple(p), GREEDY) for p in prompts])
    for p, events in zip(prompts, got):
        assert tokens(events) == alone(p, GREEDY)
    copied = mirrors[id(made.pool("draft"))]
    assert len(copied) >= 3 * 5, "each round's three later draft passes read the mirror"
    assert max(copied[1:]) <= 2 * 3, "after the first, a round copies what each reply's draft read since: a token or two"
    assert batch.runner.drafter.decoder.mirror.bytes == 0


def test_plain_and_sampled_rows_beside_drafting_ones_are_as_alone():
    """A reply without the draft and a sampled one decode as plain rows in the pass that verifies the
    drafting ones: each as alone (the sampled one with its seed: plain rows draw as they draw alone)."""
    batch = LocalBatch(engine(DRAFT.model, 3))
    sampled = GenerationParams(max_tokens=20, temperature=0.9, seed=7)
    prompts = [stream_prompt(VOCAB, 40 + s, 30) for s in range(3)]
    requests = [Request(tuple(prompts[0]), GREEDY), Request(tuple(prompts[1]), GREEDY, use_draft=False),
                Request(tuple(prompts[2]), GREEDY)]
    got = run(batch, requests)
    for p, events in zip(prompts, got):
        assert tokens(events) == alone(p, GREEDY)
    assert got[0][-1].stats.draft_proposed > 0 and got[1][-1].stats.draft_proposed == 0
    plain_sampled = Request(tuple(prompts[2]), sampled, use_draft=False)
    got = run(LocalBatch(engine(DRAFT.model, 3)), [Request(tuple(prompts[0]), GREEDY), plain_sampled])
    assert tokens(got[1]) == alone(prompts[2], sampled)


def test_a_batchs_sampled_drafted_tokens_follow_the_target_distribution():
    """1,200 seeded one-token replies, four at a time, each drafted (k = 3) by a draft that mostly disagrees:
    the first token's counts against the target's distribution, chi-square p > 0.001."""
    target, draft = tiny_qwen3(seed=3, vocab_size=512), tiny_qwen3(seed=5, vocab_size=512, layers=1)
    spec = Engine(target, None, kv=KVConfig(kind="paged", block_size=8), draft_model=draft)
    spec.draft_control = FixedDraftLength(3)
    prompt = np.random.default_rng(6).integers(0, 512, 8).tolist()
    p = np.array(distribution(target(mx.array([prompt]))[0, -1], SamplingParams(temperature=0.8)), dtype=np.float64)
    p /= p.sum()
    counts = np.zeros_like(p)
    drafted = 0
    for seeds in range(0, 1200, 4):
        batch = LocalBatch(spec)
        for events in run(batch, [Request(tuple(prompt), GenerationParams(max_tokens=1, temperature=0.8, seed=s))
                                  for s in range(seeds, seeds + 4)]):
            counts[tokens(events)[0]] += 1
            drafted += events[-1].stats.draft_proposed
        assert batch.runner.tally.largest_batch == 4
    assert drafted == 1200 * 3, "every first token came out of a round in a batch of four"
    big = p * counts.sum() >= 5  # chi-square needs expected counts of 5 or more: pool the rest
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(p[big], p[~big].sum()) * counts.sum()
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)
