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
from mlxcore.chat_template import render_chat
from sessions.chat_session import ChatSession

EXTRA = ("What is 100 - 37?", "Reverse the word garden.")
SYSTEM = "You are a helpful assistant. Answer briefly and exactly."


def turn10_prefill_fraction(target_ref: str, draft_ref: str | None = None, *, kv: str = "paged",
                            max_tokens: int = 96) -> dict:
    """The row for `mlxchat bench`: ``measure_turns`` on the named models."""
    opened = open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                         KVConfig(kind=kv))
    return measure_turns(opened.engine, max_tokens=max_tokens)


def turn10_prefill_fraction_long(target_ref: str, draft_ref: str | None = None, *, kv: str = "paged",
                                 reply_tokens: int = 300) -> dict:
    """The row for `mlxchat bench`: ten turns of ``reply_tokens``-token replies (end of text ignored), thinking
    off and on. Off, only the new message should be prefilled; on, also the last answer (Qwen3's template drops
    earlier reasoning), and nothing before it: ``on_bound`` is that share."""
    opened = open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                         KVConfig(kind=kv))
    engine = opened.engine
    engine.eos_ids = set()  # every reply runs to reply_tokens tokens
    off = measure_turns(engine, max_tokens=reply_tokens, thinking=False)
    on = measure_turns(engine, max_tokens=reply_tokens, thinking=True)
    return {"value": off["value"], "on": on["value"], "on_bound": on["bound"], "reply_tokens": reply_tokens,
            "off_turns": off["per_turn"], "on_turns": on["per_turn"]}


def measure_turns(engine: Engine, turns: int = 10, *, max_tokens: int = 96, thinking: bool = True) -> dict:
    """Run ``turns`` greedy turns; the last turn's prefilled / prompt tokens, and every turn's figures.

    ``bound``: the share of the last prompt after the last reply's answer began (its answer and the new
    message): what must be prefilled at most when earlier reasoning is dropped from history.
    """
    session = ChatSession(engine, SYSTEM, GenerationParams(max_tokens=max_tokens), enable_thinking=thinking)
    questions = (QUESTIONS + EXTRA) * (turns // (len(QUESTIONS) + len(EXTRA)) + 1)
    per_turn = []
    turn_before_last: list = []
    for question in questions[:turns]:
        turn_before_last = list(session.messages)
        session.send(question)
        stats = session.last_stats
        per_turn.append((stats.prefill_tokens, stats.prompt_tokens))
    prefilled, prompt = per_turn[-1]
    return {"value": prefilled / prompt, "prefill_tokens": prefilled, "prompt_tokens": prompt,
            "per_turn": per_turn, "bound": _after_last_answer(session, turn_before_last) / prompt}


def _after_last_answer(session: ChatSession, before: list) -> int:
    """Tokens of the last prompt from the start of the last reply's answer: (the whole prompt) - (the
    history up to and including that reply's header, rendered as the template renders it in history)."""
    last_reply = before[-1]
    header_only = before[:-1] + [type(last_reply)("assistant", "")]
    upto = render_chat(session.engine.tokenizer, [m.as_dict() for m in header_only],
                       enable_thinking=session.enable_thinking, add_generation_prompt=False)
    end_of_empty_turn = len(session.engine.tokenizer.encode("<|im_end|>\n", add_special_tokens=False))
    return session.last_stats.prompt_tokens - (len(upto) - end_of_empty_turn)
