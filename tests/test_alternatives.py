"""ChatSession.alternatives: several replies to one turn side by side, one kept; the chat goes on from it."""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import pytest

from mlxcore.engine import Engine, KVConfig
from mlxcore.errors import MlxchatError, PromptError
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from turn_checks import send_matching_a_cold_run

TARGET, DRAFT = load_model("mini-target"), load_model("mini-draft")


def session(draft: bool = True, kind: str = "paged", **params) -> ChatSession:
    engine = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind=kind, max_kv=4096 if kind == "rotating" else None),
                    draft_model=DRAFT.model if draft else None)
    made = ChatSession(engine, system="You are terse.", params=GenerationParams(max_tokens=24, **params))
    made.enable_thinking = False
    return made


def test_a_reply_that_went_past_its_end_token_keeps_it_as_shown():
    """``ignore_eos``: a reply cut by its length right after the end token it went on past showed that token as
    text, and is kept as shown, alone and side by side (the window's stopped columns met this by timing)."""
    plain = session(draft=False)
    plain.send("Hello there, who are you?")
    assert plain.last_stats.finish_reason == "eos"
    cut = GenerationParams(max_tokens=plain.last_stats.generated_tokens, ignore_eos=True)  # up to its end token
    alone, side = session(draft=False), session(draft=False)
    alone.params = side.params = cut
    shown = "".join(alone.stream("Hello there, who are you?"))
    assert shown.endswith("<|im_end|>"), shown
    alts = side.alternatives("Hello there, who are you?", 2)
    list(alts)
    assert alts.texts[0] == shown
    for chat, kept in ((alone, alone.messages[-1].content), (side, alts.keep(0))):
        assert kept == chat.messages[-1].content
        assert kept.removeprefix("<think>\n\n</think>\n\n") == shown  # (thinking off: the empty block)
        chat.params = GenerationParams(max_tokens=24)
        send_matching_a_cold_run(chat, "And then?")  # the next turn reads on from the cache it left


def test_three_sampled_replies_one_kept_and_the_chat_goes_on_from_it():
    chat = session(temperature=1.5, seed=5)  # (hot: the embedded pair is sure of its short answers)
    chat.send("Hello there, who are you?")
    before = list(chat.messages)
    alts = chat.alternatives("Tell me a story about a cat.", 3)
    chunks = list(alts)
    assert {choice for choice, _ in chunks} == {0, 1, 2}
    texts = alts.texts
    assert len(set(texts)) > 1, "sampled with their own seeds, the replies differ"
    kept = alts.keep(1)
    assert chat.messages[:len(before)] == before and chat.messages[-1].content == kept
    assert kept.strip() and texts[1].strip() in kept
    chat.params = GenerationParams(max_tokens=24)  # greedy, so the next turn can be checked against a cold run
    send_matching_a_cold_run(chat, "And then what happened?")


def test_greedy_alternatives_are_the_same_reply_and_share_the_prompt():
    chat = session(draft=False)
    chat.send("Hello there, who are you? " * 8)
    pool = chat.engine.pool("target")
    alts = chat.alternatives("Say it again.", 2)
    iterator = iter(alts)
    next(iterator)
    prompt_blocks = -(-len(chat.prompt_ids()) // 16)
    assert pool.stats().used_blocks < prompt_blocks + 2 * 3, "the conversation's blocks are held once"
    list(iterator)
    assert alts.texts[0] == alts.texts[1]
    alts.keep(0)
    send_matching_a_cold_run(chat, "Thanks.")


def test_discarding_leaves_the_history_as_it_was():
    chat = session()
    chat.send("Hi")
    before = list(chat.messages)
    alts = chat.alternatives("Write a poem.", 2)
    for count, _ in enumerate(alts):
        if count == 5:
            break
    alts.discard()
    assert chat.messages == before
    send_matching_a_cold_run(chat, "Write a poem.")


def test_regenerating_as_alternatives_replaces_the_last_reply():
    chat = session()
    chat.send("Name a colour.")
    user_turns = [m for m in chat.messages if m.role == "user"]
    alts = chat.alternatives(None, 2)
    list(alts)
    alts.keep(1)
    assert [m for m in chat.messages if m.role == "user"] == user_turns
    assert chat.messages[-1].role == "assistant"


def test_refused_turns_leave_no_trace():
    chat = session()
    before = list(chat.messages)
    with pytest.raises(PromptError):
        chat.alternatives("word " * 5000, 2)
    assert chat.messages == before
    with pytest.raises(MlxchatError, match="paged"):
        session(kind="rotating").alternatives("Hi", 2)


def run_and_keep_first(chat: ChatSession, start) -> None:
    """A turn started by ``start(batch)`` on its own scheduler, stepped to its end; its first reply kept."""
    from mlxcore.batching.local import LocalBatch
    batch = LocalBatch(chat.engine)
    turn = start(batch)
    while not turn.done:
        batch.step()
        turn.events()
    turn.keep(0)


def test_a_turn_on_the_scheduler_reuses_the_chats_cache_to_the_token():
    """As much as ``ChatSession.send`` reuses for the same turn (``Engine.generate``), not whole blocks."""
    chat, reference = session(draft=True), session(draft=True)
    for made in (chat, reference):
        made.send("Hello there, who are you?")
    reference.send("And what do you like?")
    run_and_keep_first(chat, lambda batch: chat.start_turn("And what do you like?", batch))
    stats, expected = chat.last_stats, reference.last_stats
    assert stats.reused_tokens == expected.reused_tokens and stats.reused_tokens % 16 != 0
    assert stats.prefill_tokens == expected.prefill_tokens
    assert chat.messages == reference.messages
    chat.params = GenerationParams(max_tokens=24)
    send_matching_a_cold_run(chat, "Thanks.")


def test_editing_the_last_message_on_the_scheduler():
    chat = session(draft=False)
    chat.send("Name a fruit.")
    run_and_keep_first(chat, lambda batch: chat.start_edit_last_user("Name a vegetable.", batch))
    assert [m.content for m in chat.messages if m.role == "user"] == ["Name a vegetable."]
