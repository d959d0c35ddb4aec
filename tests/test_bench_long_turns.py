"""The long-reply turn bench: replies shaped as Qwen3's, and the share it holds prefill to."""

from __future__ import annotations

from session_kill_helper import tiny_engine

from bench.scripted_replies import added_token_ids, scripted_replies
from bench.session_turns import converse


def _reply_ids(session) -> list[list[int]]:
    tokenizer = session.engine.tokenizer
    return [tokenizer.encode(m.content, add_special_tokens=False) for m in session.history if m.role == "assistant"]


def test_scripted_replies_hold_no_markup_and_one_think_block():
    engine = tiny_engine("paged", draft=False)
    engine.eos_ids = set()
    added = added_token_ids(engine.tokenizer)
    markup = {added["<|im_start|>"], added["<|im_end|>"], added["<|endoftext|>"]}
    with scripted_replies(engine.tokenizer, thinking=True, think_tokens=6):
        session, _ = converse(engine, 3, max_tokens=24, thinking=True)
    replies = [m.content for m in session.history if m.role == "assistant"]
    assert len(replies) == 3
    for reply, ids in zip(replies, _reply_ids(session)):
        assert reply.startswith("<think>") and reply.count("<think>") == 1 and reply.count("</think>") == 1
        assert not markup & set(ids)
    with scripted_replies(engine.tokenizer, thinking=False):
        plain, _ = converse(engine, 2, max_tokens=24, thinking=False)
    for reply in (m.content for m in plain.history if m.role == "assistant"):
        assert "<think>" not in reply.replace("<think>\n\n</think>\n\n", "", 1) and "<|im_" not in reply


def test_thinking_turns_prefill_only_the_last_answer_and_the_new_message():
    engine = tiny_engine("paged", draft=False)
    engine.eos_ids = set()
    with scripted_replies(engine.tokenizer, thinking=True, think_tokens=10):
        session, turns = converse(engine, 3, max_tokens=40, thinking=True)
    prefilled, prompt = turns["per_turn"][-1]
    answer = session.history[-3].content.split("</think>")[-1].strip()  # turn 2's answer
    answer_tokens = len(engine.tokenizer.encode(answer, add_special_tokens=False))
    # The bound covers that answer and the new message's turn; the earlier turns are reused from the cache.
    assert answer_tokens < turns["bound"] * prompt < answer_tokens + 40
    assert prefilled <= round(turns["bound"] * prompt)
    with scripted_replies(engine.tokenizer, thinking=False):
        _, off = converse(engine, 3, max_tokens=40, thinking=False)
    assert off["per_turn"][-1][0] < 40  # only the new message: every reply's tokens were reused
