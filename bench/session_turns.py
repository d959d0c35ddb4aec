"""Bench row ``turn10_prefill_fraction``: tokens prefilled at turn 10 / tokens of the whole conversation.

A 10-turn greedy conversation in one ChatSession; at turn 10 the engine
reports the prompt's length (the whole templated conversation) and how many
of its tokens it had to compute (the rest came from the cache).
"""

from __future__ import annotations

from bench.prompts import QUESTIONS
from bench.scripted_replies import scripted_replies
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


def turn10_prefill_fraction_long(target_ref: str, *, kv: str = "paged", reply_tokens: int = 300,
                                 think_tokens: int = 100) -> dict:
    """The row for `mlxchat bench`: ten turns of ``reply_tokens``-token replies (end of text ignored), thinking
    off and on. Off, only the new message should be prefilled; on, also the last answer (Qwen3's template drops
    earlier reasoning), and nothing before it: ``on_bound`` is that share.

    Replies are the model's greedy tokens shaped by ``scripted_replies``: no chat markup inside, and with
    thinking on ``think_tokens`` of reasoning in a think block. Plain decoding (the shaping is plain decoding's).
    """
    opened = open_engine(ModelChoice(model=target_ref, no_draft=True), KVConfig(kind=kv))
    engine = opened.engine
    engine.eos_ids = set()  # every reply runs to reply_tokens tokens
    with scripted_replies(engine.tokenizer, thinking=False):
        off = measure_turns(engine, max_tokens=reply_tokens, thinking=False)
    with scripted_replies(engine.tokenizer, thinking=True, think_tokens=think_tokens):
        on = measure_turns(engine, max_tokens=reply_tokens, thinking=True)
    return {"value": off["value"], "on": on["value"], "on_bound": on["bound"], "reply_tokens": reply_tokens,
            "think_tokens": think_tokens,
            "off_turns": off["per_turn"], "on_turns": on["per_turn"]}


def measure_turns(engine: Engine, turns: int = 10, *, max_tokens: int = 96, thinking: bool = True) -> dict:
    """Run ``turns`` greedy turns; the last turn's prefilled / prompt tokens, and every turn's figures.

    ``bound``: the share of the last prompt after the last reply's answer began (its answer and the new
    message): what must be prefilled at most when earlier reasoning is dropped from history.
    """
    return converse(engine, turns, max_tokens=max_tokens, thinking=thinking)[1]


def converse(engine: Engine, turns: int, *, max_tokens: int, thinking: bool) -> tuple[ChatSession, dict]:
    """``measure_turns``, and the session it ran."""
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
    return session, {"value": prefilled / prompt, "prefill_tokens": prefilled, "prompt_tokens": prompt,
                     "per_turn": per_turn, "bound": _after_last_answer(session, turn_before_last) / prompt}


def _after_last_answer(session: ChatSession, before: list) -> int:
    """Tokens of the last prompt from the start of the last reply's answer: (the whole prompt) - (the
    history before that reply, with the header the template opens a reply with).

    With thinking on that header is the generation prompt's ``<|im_start|>assistant\n``; an empty
    assistant message cannot stand in for it, since the template gives the last message an empty think block.
    """
    upto = render_chat(session.engine.tokenizer, [m.as_dict() for m in before[:-1]],
                       enable_thinking=session.enable_thinking, add_generation_prompt=True)
    return session.last_stats.prompt_tokens - len(upto)
