"""Rows on the Qwen3.5-9B twin for hybrid models served as ``serve`` serves them: requests without caches.

- ``hybrid_batch_vs_alone``: output tok/s of 4 requests side by side on the scheduler
  (``mlxcore/batching/hybrid_batch.py``) / the same 4 one at a time, each pair alternated; greedy, and
  every request's tokens must be the same both ways.
- ``hybrid_request_turn10_prefill_fraction``: a 10-turn conversation sent as API clients send it, every
  turn a new request carrying the whole history (assistant turns as their answer only); turn 10's
  prefilled / prompt tokens, with the kept caches of ended requests (``mlxcore/kv/hybrid_prefixes.py``)
  and without (then every turn reads its whole prompt), thinking off and on.
"""

from __future__ import annotations

import time

from bench.prompts import QUESTIONS
from bench.scripted_replies import scripted_replies
from bench.session_turns import EXTRA, SYSTEM
from bench.side_by_side import side_by_side
from bench.timing import paired_median
from bench.twins import twin_folder
from mlxcore.chat_template import render_chat
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.kv.hybrid_prefixes import HybridPrefixCache
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams

TWIN = "qwen3.5-9b"


def _engine() -> Engine:
    engine = open_engine(ModelChoice(model=str(twin_folder(TWIN, bits=None)), no_draft=True),
                         KVConfig(kind="standard")).engine
    engine.eos_ids = set()  # every reply runs to its length
    return engine


def _answer(engine: Engine, prompts: list[list[int]], params: GenerationParams, at_once: int):
    """(tokens of each, its final event) for ``prompts``, ``at_once`` at most at once, no kept caches."""
    engine.prefixes.clear()
    return [([e.token for e in events if isinstance(e, TokenEvent)], events[-1])
            for events in side_by_side(engine, prompts, params, max_running=at_once)[1]]


def hybrid_batch_vs_alone(runs: int, requests: int = 4, tokens: int = 32) -> dict:
    engine = _engine()
    prompts = [render_chat(engine.tokenizer, [{"role": "user", "content": q}], enable_thinking=False,
                           add_generation_prompt=True) for q in QUESTIONS[:requests]]
    params = GenerationParams(temperature=0.0, max_tokens=tokens)
    replies: dict[int, list] = {}

    def rate(at_once: int):
        def run() -> float:
            start = time.perf_counter()
            answered = _answer(engine, prompts, params, at_once)
            seconds = time.perf_counter() - start
            got = [t for t, _ in answered]
            if replies.setdefault(0, got) != got:
                raise AssertionError("batched replies differ from the same requests one at a time")
            return sum(len(t) for t in got) / seconds
        return run

    rate(1)()  # warm up: the first pass of each shape compiles
    result = paired_median(rate(requests), rate(1), runs)
    return {"value": result["ratio"], "ratios": result["ratios"], "batched_tok_s": result["ours"],
            "alone_tok_s": result["theirs"], "requests": requests, "tokens": tokens,
            "prompt_tokens": [len(p) for p in prompts], "model": f"{TWIN} twin, float32"}


def hybrid_request_turn10_prefill_fraction(reply_tokens: int = 60, think_tokens: int = 30, turns: int = 10) -> dict:
    engine = _engine()
    limit = engine.prefixes.limit
    row: dict = {"reply_tokens": reply_tokens, "think_tokens": think_tokens, "model": f"{TWIN} twin, float32"}
    for thinking in (False, True):
        for kept in (True, False):
            engine._prefixes = HybridPrefixCache(limit if kept else 0)
            with scripted_replies(engine.tokenizer, thinking=thinking, think_tokens=think_tokens):
                figures = _request_turns(engine, reply_tokens, thinking, turns)
            name = ("on" if thinking else "off") + ("" if kept else "_not_kept")
            row[name], row[name + "_turns"] = figures[-1][0] / figures[-1][1], figures
    row["value"] = row.pop("off")
    return row


def _request_turns(engine: Engine, reply_tokens: int, thinking: bool, turns: int = 10) -> list[tuple[int, int]]:
    """(prefilled, prompt) tokens of each turn, each a request with the whole history as a client sends it."""
    messages = [{"role": "system", "content": SYSTEM}]
    questions = (QUESTIONS + EXTRA) * (turns // (len(QUESTIONS) + len(EXTRA)) + 1)
    figures = []
    for question in questions[:turns]:
        messages.append({"role": "user", "content": question})
        prompt = render_chat(engine.tokenizer, messages, enable_thinking=thinking, add_generation_prompt=True)
        (tokens, final), = _answer_kept(engine, prompt, GenerationParams(temperature=0.0, max_tokens=reply_tokens))
        text = engine.tokenizer.decode(tokens)
        answer = text.split("</think>", 1)[-1].strip() if thinking else text
        messages.append({"role": "assistant", "content": answer})
        figures.append((final.stats.prefill_tokens, final.stats.prompt_tokens))
    return figures


def _answer_kept(engine: Engine, prompt: list[int], params: GenerationParams):
    """One request as ``serve`` runs it, the store of kept caches as it stands."""
    events = side_by_side(engine, [prompt], params, max_running=1)[1][0]
    assert isinstance(events[-1], FinalEvent)
    return [([e.token for e in events if isinstance(e, TokenEvent)], events[-1])]
