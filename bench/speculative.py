"""Rows `spec_speedup_greedy`, `spec_vs_mlx_lm_greedy`, `accept_vs_mlx_lm_t06`, `spec_worst_case`."""

from __future__ import annotations

import time

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler

from bench.prompts import chat_prompts
from bench.timing import paired_median
from bench.draft_lengths import FixedDraftLength
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams

MAX_TOKENS = 200


def _rate_over_prompts(run_one, prompts) -> float:
    """Decode tok/s over all prompts: sum of (tokens - 1) / sum of time from first to last token."""
    tokens = seconds = 0.0
    for ids in prompts:
        stamps = [time.perf_counter() for _ in run_one(ids)]
        tokens, seconds = tokens + len(stamps) - 1, seconds + stamps[-1] - stamps[0]
    return tokens / seconds


def _ours(engine: Engine, params: GenerationParams):
    def run_one(ids):
        return (e for e in engine.generate(ids, engine.new_caches(), params) if isinstance(e, TokenEvent))
    return run_one


def _theirs(model, tokenizer, draft, k: int, temperature: float, tokens: int = MAX_TOKENS):
    def run_one(ids):
        return stream_generate(model, tokenizer, ids, max_tokens=tokens, draft_model=draft,
                               num_draft_tokens=k, sampler=make_sampler(temp=temperature))
    return run_one


def _pair(target_ref: str, draft_ref: str):
    target, draft = load_model(target_ref), load_model(draft_ref)
    return target, draft, chat_prompts(target.tokenizer)


def spec_speedup_greedy(target_ref: str, draft_ref: str, runs: int, tokens: int = MAX_TOKENS) -> dict:
    target, draft, prompts = _pair(target_ref, draft_ref)
    kv = KVConfig(kind="paged")
    plain = Engine(target.model, target.tokenizer, kv=kv)
    spec = Engine(target.model, target.tokenizer, kv=kv, draft_model=draft.model)
    params = GenerationParams(max_tokens=tokens)
    ours, base = _ours(spec, params), _ours(plain, params)
    _rate_over_prompts(ours, prompts[:2]), _rate_over_prompts(base, prompts[:2])  # warm up, learn k
    r = paired_median(lambda: _rate_over_prompts(ours, prompts), lambda: _rate_over_prompts(base, prompts), runs)
    return {"value": r["ratio"], "spec_tps": r["ours"], "plain_tps": r["theirs"],
            "k_chosen": list(spec.last_stats.draft_lengths[-8:]), "ratios": r["ratios"]}


def spec_vs_mlx_lm_greedy(target_ref: str, draft_ref: str, runs: int, their_k: int = 2,
                          tokens: int = MAX_TOKENS) -> dict:
    """Against mlx-lm's speculative generation with its default draft length (2)."""
    target, draft, prompts = _pair(target_ref, draft_ref)
    spec = Engine(target.model, target.tokenizer, kv=KVConfig(kind="paged"), draft_model=draft.model)
    ours = _ours(spec, GenerationParams(max_tokens=tokens))
    theirs = _theirs(target.model, target.tokenizer, draft.model, their_k, 0.0, tokens)
    _rate_over_prompts(ours, prompts[:2]), _rate_over_prompts(theirs, prompts[:2])
    r = paired_median(lambda: _rate_over_prompts(ours, prompts), lambda: _rate_over_prompts(theirs, prompts), runs)
    return {"value": r["ratio"], "ours_tps": r["ours"], "mlx_lm_tps": r["theirs"], "mlx_lm_k": their_k,
            "ratios": r["ratios"]}


def _acceptance(spec: Engine, target, draft, prompts, k: int, temperature: float, seeds: int,
                tokens: int) -> tuple[float, float]:
    """Accepted drafts per round, (ours, mlx-lm's), over ``seeds`` x prompts, both drafting k per round."""
    ours_acc = ours_rounds = their_acc = their_rounds = 0
    for seed in range(seeds):
        for ids in prompts:
            params = GenerationParams(max_tokens=tokens, temperature=temperature, seed=seed)
            for _ in spec.generate(ids, spec.new_caches(), params):
                pass
            ours_acc += spec.last_stats.draft_accepted
            ours_rounds += spec.last_stats.draft_proposed / k
            mx.random.seed(seed)
            flags = [r.from_draft for r in _theirs(target.model, target.tokenizer, draft.model, k, temperature, tokens)(ids)]
            their_acc += sum(flags)
            their_rounds += flags.count(False) + bool(flags and flags[-1])  # each round ends with a target token
    return ours_acc / ours_rounds, their_acc / their_rounds


def accept_vs_mlx_lm_t06(target_ref: str, draft_ref: str, runs: int, k: int = 4, tokens: int = MAX_TOKENS) -> dict:
    """Accepted drafts per round at temperature 0.6, both drafting exactly k tokens per round.

    Rejection sampling accepts a draft with probability sum(min(p, q)); mlx-lm only
    when its target sample equals the draft's, sum(p q). The gap grows with the
    entropy of p and q, so temperature 1.0 is reported beside the 0.6 headline.
    """
    target, draft, prompts = _pair(target_ref, draft_ref)
    spec = Engine(target.model, target.tokenizer, kv=KVConfig(kind="paged"), draft_model=draft.model)
    spec.draft_control = FixedDraftLength(k)
    ours, theirs = _acceptance(spec, target, draft, prompts, k, 0.6, runs, tokens)
    ours_t1, theirs_t1 = _acceptance(spec, target, draft, prompts, k, 1.0, runs, tokens)
    return {"value": ours / theirs, "ours_per_round": ours, "mlx_lm_per_round": theirs, "k": k,
            "ratio_t1": ours_t1 / theirs_t1, "ours_per_round_t1": ours_t1, "mlx_lm_per_round_t1": theirs_t1}


def spec_worst_case(target_ref: str, draft_ref: str, runs: int, tokens: int = MAX_TOKENS) -> dict:
    """With an untrained draft (the draft's shape, random weights): speculative / plain tok/s."""
    target, draft, prompts = _pair(target_ref, draft_ref)
    mx.random.seed(0)
    untrained = type(draft.model)(draft.model.args)  # fresh random weights, same architecture
    mx.eval(untrained.parameters())
    kv = KVConfig(kind="paged")
    plain = Engine(target.model, target.tokenizer, kv=kv)
    spec = Engine(target.model, target.tokenizer, kv=kv, draft_model=untrained)
    params = GenerationParams(max_tokens=tokens)
    ours, base = _ours(spec, params), _ours(plain, params)
    _rate_over_prompts(ours, prompts[:2]), _rate_over_prompts(base, prompts[:2])
    r = paired_median(lambda: _rate_over_prompts(ours, prompts), lambda: _rate_over_prompts(base, prompts), runs)
    return {"value": r["ratio"], "spec_tps": r["ours"], "plain_tps": r["theirs"], "ratios": r["ratios"]}
