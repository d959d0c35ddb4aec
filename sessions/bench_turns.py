"""Bench row ``turn10_prefill_fraction``: tokens prefilled at turn 10 / tokens of the whole conversation.

A 10-turn greedy conversation in one ChatSession; at turn 10 the engine
reports the prompt's length (the whole templated conversation) and how many
of its tokens it had to compute (the rest came from the cache).
"""

from __future__ import annotations

from mlxcore.bench.prompts import QUESTIONS
from mlxcore.engine import Engine, KVConfig
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession

EXTRA = ("What is 100 - 37?", "Reverse the word garden.")
SYSTEM = "You are a helpful assistant. Answer briefly and exactly."


def turn10_prefill_fraction(target_ref: str, draft_ref: str | None = None, *, kv: str = "paged",
                            max_tokens: int = 96) -> dict:
    """The row for `mlxchat bench`: ``measure_turns`` on the named models."""
    opened = open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                         KVConfig(kind=kv))
    return measure_turns(opened.engine, max_tokens=max_tokens)


def measure_turns(engine: Engine, turns: int = 10, *, max_tokens: int = 96) -> dict:
    """Run ``turns`` greedy turns; the last turn's prefilled / prompt tokens, and every turn's figures."""
    session = ChatSession(engine, SYSTEM, GenerationParams(max_tokens=max_tokens))
    questions = (QUESTIONS + EXTRA) * (turns // (len(QUESTIONS) + len(EXTRA)) + 1)
    per_turn = []
    for question in questions[:turns]:
        session.send(question)
        stats = session.last_stats
        per_turn.append((stats.prefill_tokens, stats.prompt_tokens))
    prefilled, prompt = per_turn[-1]
    return {"value": prefilled / prompt, "prefill_tokens": prefilled, "prompt_tokens": prompt,
            "per_turn": per_turn}
