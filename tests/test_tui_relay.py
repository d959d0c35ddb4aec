"""The engine host's reply relay and the chat view's text helpers, without a model or a screen."""

from __future__ import annotations

import pickle

from app.engine_host import protocol as p
from app.engine_host import reply_stream
from app.engine_host.inbox import Inbox
from app.engine_host.reply_stream import relay_reply
from app.tui.text_parts import code_blocks, split_reply


def fake_reply(pieces: list[str], closed: list[bool]):
    try:
        yield from pieces
    finally:
        closed.append(True)


def test_relay_batches_and_splits_thinking_from_answer(monkeypatch):
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 0.0)  # every piece its own chunk
    sent, closed = [], []
    pieces = ["<th", "ink>\nhm", "m\n</thi", "nk>\n\n", "Hel", "lo"]
    relay_reply(fake_reply(pieces, closed), sent.append, lambda: False)
    assert "".join(c.thinking for c in sent) == "\nhmm\n"
    assert "".join(c.answer for c in sent) == "Hello"
    assert "".join(c.raw for c in sent) == "".join(pieces), "the raw text is what the session stores"
    assert len(sent) > 2 and closed == [True]


class ScriptedChannel:
    """A channel whose receive(timeout=0) returns the next scripted answer per poll (None: nothing yet)."""

    def __init__(self, polls: list) -> None:
        self.polls = polls

    def receive(self, timeout=None):
        return self.polls.pop(0) if self.polls else None


def test_stop_closes_the_reply_and_other_commands_wait(monkeypatch):
    sent, closed = [], []
    inbox = Inbox(ScriptedChannel([None, p.ListSessions("x"), None, p.Stop()]))
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 10.0)  # one chunk at the end
    relay_reply(fake_reply(["a", "b", "c", "d", "e"], closed), sent.append, inbox.stop_asked)
    assert closed == [True], "stopping closes the ChatSession stream (which keeps the partial reply)"
    assert "".join(c.answer for c in sent) == "abc", "what was generated before the stop is all sent"
    assert list(inbox.deferred) == [p.ListSessions("x")]
    assert inbox.next() == p.ListSessions("x"), "a command that came during the reply is handled after it"


def test_a_closed_pipe_stops_the_reply_once_and_ends_the_host(monkeypatch):
    """After EOF every receive says Shutdown: the reply stops, and the host sees one Shutdown, not a flood."""
    class ClosedPipe:
        reads = 0

        def receive(self, timeout=None):
            self.reads += 1
            return p.Shutdown()
    pipe, sent, closed = ClosedPipe(), [], []
    inbox = Inbox(pipe)
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 10.0)  # one chunk at the end
    relay_reply(fake_reply(["a", "b", "c"], closed), sent.append, inbox.stop_asked)
    assert closed == [True] and "".join(c.answer for c in sent) == "a"
    assert pipe.reads == 1 and list(inbox.deferred) == [p.Shutdown()]
    assert inbox.next() == p.Shutdown()


def test_a_gone_ui_stops_the_reply_without_reading_the_pipe(monkeypatch):
    class Unread:
        def receive(self, timeout=None):
            raise AssertionError("nothing should be read once the UI is known to be gone")
    inbox, closed = Inbox(Unread()), []
    inbox.ui_gone.set()
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 10.0)  # one chunk at the end
    relay_reply(fake_reply(["a", "b"], closed), [].append, inbox.stop_asked)
    assert closed == [True]
    assert inbox.next() == p.Shutdown()


def test_protocol_messages_pickle():
    for message in (p.Open(params={"temperature": 0.0}, messages=(("user", "hi"),)), p.Chunk("a", "b", 2, "<think>a</think>b"),
                    p.Done("eos", {"decode_tps": 1.0}, 0.0), p.Failure("t", "m", True), p.Send("hi", n=3), p.Pick(1),
                    p.Conversation(None, "t", (), {}, None, True, False, False, turn=2,
                                   replies=(p.ReplySoFar("<think>a"), p.ReplySoFar("b", "eos"))),
                    p.ChoiceEnded(1, "stopped"), p.Generating(("a",), ("b",))):
        assert pickle.loads(pickle.dumps(message)) == message


def test_split_reply_and_code_blocks():
    assert split_reply("<think>\nwhy\n</think>\n\nAnswer") == ("\nwhy\n", "Answer")
    assert split_reply("No thinking") == ("", "No thinking")
    text = "Try:\n\n```python\nprint(1)\n```\n\nand\n\n~~~\nls -l\n~~~\n"
    assert code_blocks(text) == ["print(1)", "ls -l"]
