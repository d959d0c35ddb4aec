"""The engine host's reply relay and the chat view's text helpers, without a model or a screen."""

from __future__ import annotations

import pickle

from app.tui import protocol as p
from app.tui.reply_stream import relay_reply
from app.tui.text_parts import code_blocks, split_reply


def fake_reply(pieces: list[str], closed: list[bool]):
    try:
        yield from pieces
    finally:
        closed.append(True)


def test_relay_batches_and_splits_thinking_from_answer():
    sent, closed = [], []
    pieces = ["<th", "ink>\nhm", "m\n</thi", "nk>\n\n", "Hel", "lo"]
    relay_reply(fake_reply(pieces, closed), sent.append, lambda: None, [].append, flush_seconds=0.0)
    assert "".join(c.thinking for c in sent) == "\nhmm\n"
    assert "".join(c.answer for c in sent) == "Hello"
    assert len(sent) > 2 and closed == [True]


def test_stop_closes_the_reply_and_other_commands_wait():
    sent, closed, deferred = [], [], []
    inbox = [None, p.ListSessions("x"), p.Stop()]
    poll = lambda: inbox.pop(0) if inbox else None  # noqa: E731
    relay_reply(fake_reply(["a", "b", "c", "d", "e"], closed), sent.append, poll, deferred.append,
                flush_seconds=10.0)
    assert closed == [True], "stopping closes the ChatSession stream (which keeps the partial reply)"
    assert "".join(c.answer for c in sent) == "ab", "what was generated before the stop is all sent"
    assert deferred == [p.ListSessions("x")]


def test_protocol_messages_pickle():
    for message in (p.Open(params={"temperature": 0.0}, messages=(("user", "hi"),)), p.Chunk("a", "b", 2),
                    p.Done("eos", {"decode_tps": 1.0}, 0.0), p.Failure("t", "m", True)):
        assert pickle.loads(pickle.dumps(message)) == message


def test_split_reply_and_code_blocks():
    assert split_reply("<think>\nwhy\n</think>\n\nAnswer") == ("\nwhy\n", "Answer")
    assert split_reply("No thinking") == ("", "No thinking")
    text = "Try:\n\n```python\nprint(1)\n```\n\nand\n\n~~~\nls -l\n~~~\n"
    assert code_blocks(text) == ["print(1)", "ls -l"]
