"""The engine host's relay of a turn on the scheduler (app/engine_host/reply_run.py), on a scripted turn: no model.

The turn stands in for ``sessions.batched_turn.BatchedTurn``: ``events()`` gives the scripted (choice, event)
pairs of one scheduler step per call; a failed request's events come first, then its failure is recorded
in ``failures`` (as the real turn records it).
"""

from __future__ import annotations

import threading

from app.engine_host import protocol as p
from app.engine_host import reply_stream
from app.engine_host.reply_run import ReplyRun
from mlxcore.batching.errors import OverloadedError
from mlxcore.batching.handle import RequestFailedError
from mlxcore.events import FinalEvent, GenerationStats, TokenEvent


class Handle:
    def __init__(self) -> None:
        self.finished = threading.Event()


class ScriptedTurn:
    """``steps``: per call of ``events()``, the (choice, text or FinalEvent) it gives, or an exception to raise."""

    def __init__(self, n: int, steps: list, progress: tuple[int, int] = (0, 10)) -> None:
        self.handles = [Handle() for _ in range(n)]
        self.texts, self.tokens, self.finals = [""] * n, [[] for _ in range(n)], [None] * n
        self.failures = [None] * n
        self.steps, self.progress, self.kept, self.stopped = list(steps), progress, None, False

    def events(self):
        step = self.steps.pop(0) if self.steps else []
        got = []
        for choice, item in step:
            if isinstance(item, BaseException):
                self.failures[choice] = item
                continue
            event = item if isinstance(item, FinalEvent) else TokenEvent(token=1, text=item, logprob=0.0)
            self.record(choice, event)
            got.append((choice, event))
        return got

    def record(self, choice: int, event) -> None:
        if isinstance(event, FinalEvent):
            self.finals[choice] = event
            self.handles[choice].finished.set()
        else:
            self.texts[choice] += event.text
            self.tokens[choice].append(event.token)

    def prompt_progress(self) -> tuple[int, int]:
        return self.progress

    def stop(self) -> None:
        self.stopped = True

    def keep(self, choice: int) -> str:
        self.kept = choice
        final = self.finals[choice]
        return final.text if final is not None else self.texts[choice]


def final(reason: str, text: str = "") -> FinalEvent:
    return FinalEvent(reason, text, GenerationStats(generated_tokens=3, finish_reason=reason))


def pump_all(run: ReplyRun, send) -> None:
    while run.turn.steps:
        run.pump(send)


def test_a_reply_streams_piece_by_piece_and_says_its_prompt_is_being_read(monkeypatch):
    pieces = ["<think>", "hm", "</think>", "\n\nHel", "lo"]
    turn = ScriptedTurn(1, [[(0, piece)] for piece in pieces] + [[(0, final("eos", "Hello"))]])
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 0.0)
    run, sent = ReplyRun(turn, 1), []
    run.started(sent.append)
    pump_all(run, sent.append)
    assert sent[0] == p.Prefill(0, 10), "the prompt is being read: said at once"
    chunks = [event for event in sent if isinstance(event, p.Chunk)]
    assert [c.pieces for c in chunks] == [1] * len(pieces) + [0], "a chunk per piece, then the end"
    assert "".join(c.raw for c in chunks) == "".join(pieces)
    assert ("".join(c.thinking for c in chunks), "".join(c.answer for c in chunks)) == ("hm", "Hello")
    assert not run.generating and run.ended == ["eos"]
    assert not [e for e in sent if isinstance(e, (p.Prefill, p.ChoiceEnded))][1:], "no progress once text came"


def test_text_made_off_screen_comes_back_with_the_chat_and_streams_on_from_there(monkeypatch):
    turn = ScriptedTurn(1, [[(0, "one ")], [(0, "two ")], [(0, "three")], [(0, final("length"))]])
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 0.0)
    run, sent = ReplyRun(turn, 1), []
    run.pump(None)
    run.pump(None)  # the chat is in the background: nothing sent
    assert sent == [] and run.so_far() == (p.ReplySoFar("one two "),)
    pump_all(run, sent.append)  # on screen again
    assert "".join(e.raw for e in sent if isinstance(e, p.Chunk)) == "three"
    assert run.so_far() == (p.ReplySoFar("one two three", "length"),)


def test_replies_side_by_side_each_say_when_they_end(monkeypatch):
    turn = ScriptedTurn(2, [[(0, "a"), (1, "b")], [(1, final("cancelled"))], [(0, final("eos"))]])
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 10.0)
    run, sent = ReplyRun(turn, 3), []
    pump_all(run, sent.append)
    ends = [e for e in sent if isinstance(e, p.ChoiceEnded)]
    assert ends == [p.ChoiceEnded(1, "stopped"), p.ChoiceEnded(0, "eos")], "cancelled is said as stopped"
    assert [(c.choice, c.raw) for c in sent if isinstance(c, p.Chunk)] == [(1, "b"), (0, "a")], \
        "a reply's text is sent when it ends, whatever the flush interval"
    run.keep(1)
    assert turn.kept == 1 and run.done(1, 4096, False).finish_reason == "stopped"


def test_the_end_of_a_reply_brings_the_text_its_token_events_did_not_carry(monkeypatch):
    """The detokenizer may hold a tail back until the reply ends: the UI must show what the chat keeps."""
    turn = ScriptedTurn(2, [[(0, "It is"), (1, "No")], [(0, final("cancelled", "It is 4<|im_end|>")),
                                                         (1, final("eos", "Other text"))]])
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 0.0)
    run, sent = ReplyRun(turn, 3), []
    pump_all(run, sent.append)
    shown = ["".join(c.raw for c in sent if isinstance(c, p.Chunk) and c.choice == choice) for choice in (0, 1)]
    assert shown[0] == "It is 4<|im_end|>" == run.keep(0), "the held tail is sent before the reply's end"
    assert shown[1] == "No", "a final text that does not extend what was shown adds nothing"
    assert sent.index(p.ChoiceEnded(0, "stopped")) > max(i for i, e in enumerate(sent) if isinstance(e, p.Chunk)
                                                          and e.choice == 0)


def test_a_failed_request_ends_its_reply_and_keeps_what_it_generated(monkeypatch):
    failure = RequestFailedError("The engine failed while generating")
    failure.__cause__ = OverloadedError("The KV memory budget is held by other chats")
    turn = ScriptedTurn(1, [[(0, "Once upon")], [(0, " a time"), (0, failure)]])
    monkeypatch.setattr(reply_stream, "FLUSH_SECONDS", 10.0)
    run, sent = ReplyRun(turn, 1), []
    run.pump(sent.append)
    run.pump(sent.append)
    assert isinstance(run.error, OverloadedError) and run.ended == ["error"]
    assert "".join(c.raw for c in sent if isinstance(c, p.Chunk)) == "Once upon a time"
    assert run.keep(0) == "Once upon a time", "the reply as far as it got"
    assert run.done(0, 4096, False).finish_reason == "error"
