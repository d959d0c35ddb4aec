"""Rows `block_draft_speedup_greedy` (with `spec_speedup_greedy` of the same run), `block_draft_batch4_vs_plain`
and `lookup_batch4_vs_plain`: the block drafter (DFlash layout) against plain decoding and the draft model.

- ``block_draft_speedup_greedy``: greedy decode tok/s on the embedded target with its trained block drafter
  (``assets/models/mini-dflash``) / without a drafter; in the same run, interleaved, with the embedded draft model
  / without (``spec_speedup`` in the row: the draft model's figure to compare with). Skipped, saying so, while
  the folder is not there.
- ``block_draft_batch4_vs_plain`` and ``lookup_batch4_vs_plain``: 4 streaming clients of `mlxchat serve`
  with the block drafter (prompt lookup) / without, as ``spec_batch2_vs_plain`` measures the draft model.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from assets import MODELS_DIR
from bench.prompts import chat_prompts
from bench.spec_batch import spec_batch_vs_plain
from bench.speculative import _ours, _rate_over_prompts
from mlxcore.block_drafter import load_block_drafter
from mlxcore.engine import Engine, KVConfig
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams

MINI_BLOCK = MODELS_DIR / "mini-dflash"  # the embedded pair's trained block drafter (recipe/, z-lab's layout)
MISSING = {"value": None, "skipped": f"{MINI_BLOCK} is not there: no trained block drafter for the embedded pair "
                                     "yet (recipe/ trains and exports it)"}


def block_draft_speedup_greedy(target_ref: str, draft_ref: str, runs: int, tokens: int = 200,
                               drafter: Path = MINI_BLOCK) -> dict:
    """Block drafter / plain and draft model / plain, greedy, the three runs of each round interleaved (their
    order turning), the medians of each round's ratios."""
    if not (drafter / "config.json").is_file():
        return MISSING
    target, draft = load_model(target_ref), load_model(draft_ref)
    kv = KVConfig(kind="paged")
    engines = {"block": Engine(target.model, target.tokenizer, kv=kv,
                               block_drafter=load_block_drafter(drafter, target.model)),
               "spec": Engine(target.model, target.tokenizer, kv=kv, draft_model=draft.model),
               "plain": Engine(target.model, target.tokenizer, kv=kv)}
    params = GenerationParams(max_tokens=tokens)
    prompts = chat_prompts(target.tokenizer)
    runners = {name: _ours(engine, params) for name, engine in engines.items()}
    for run in runners.values():  # warm up: compiled kernels, the draft lengths
        _rate_over_prompts(run, prompts[:2])
    rates: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for i in range(runs):
        for name in order[i % 3:] + order[:i % 3]:
            rates[name].append(_rate_over_prompts(runners[name], prompts))
    block = [b / p for b, p in zip(rates["block"], rates["plain"])]
    spec = [s / p for s, p in zip(rates["spec"], rates["plain"])]
    stats = engines["block"].last_stats
    return {"value": statistics.median(block), "spec_speedup": statistics.median(spec), "ratios": block,
            "block_tps": statistics.median(rates["block"]), "spec_tps": statistics.median(rates["spec"]),
            "plain_tps": statistics.median(rates["plain"]),
            "acceptance": round(stats.acceptance, 3) if stats and stats.draft_proposed else None,
            "k_chosen": list(stats.draft_lengths[-8:]) if stats else None, "drafter": str(drafter)}


def block_draft_batch4_vs_plain(target_ref: str, runs: int, requests: int, max_tokens: int,
                                drafter: Path = MINI_BLOCK) -> dict:
    if not (drafter / "config.json").is_file():
        return MISSING
    return spec_batch_vs_plain(target_ref, str(drafter), runs, 4, requests, max_tokens)


def lookup_batch4_vs_plain(target_ref: str, runs: int, requests: int, max_tokens: int) -> dict:
    return spec_batch_vs_plain(target_ref, "lookup", runs, 4, requests, max_tokens)
