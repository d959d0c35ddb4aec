"""One choice of a reply as its events arrive: its text split into reasoning, answer and tool calls (the one
reply parser, ``mlxcore.reply_parser``), logprobs, finish.

``ChoiceState.feed(event)`` returns what the event adds (a ``Delta``), which a
stream sends at once (the deltas of events that arrived together as one,
``coalesce``); the state keeps the sums, which a non-streaming reply sends at
the end. The same object serves both, so the two cannot disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from mlxcore import CallDelta, Event, FinalEvent, ParsedDelta, ReplyParser, TokenEvent, ToolCall

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "cancelled"}


@dataclass(frozen=True)
class TokenLogprob:
    """One position's log-probabilities: the token chosen, then the likeliest ones (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Delta:
    """What events add to a choice: one event's (``ChoiceState.feed``), or a run of them (``coalesce``)."""

    reasoning: str = ""
    content: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens' own
    finish_reason: str | None = None  # OpenAI's: "stop", "length" or "tool_calls"
    tool_calls: tuple[CallDelta, ...] = ()

    def then(self, after: Delta) -> Delta | None:
        """This delta and the next as one, or None where one chunk would reorder them: each API sends a chunk's
        reasoning, then its text, then its calls, so text after a call (or reasoning after text) starts anew."""
        if self.finish_reason is not None:
            return None
        kinds = [i for i, part in enumerate((after.reasoning, after.content, after.tool_calls)) if part]
        if kinds and any(part for part in (self.reasoning, self.content, self.tool_calls)[kinds[0] + 1:]):
            return None
        calls = list(self.tool_calls)
        for piece in after.tool_calls:  # a call's arguments go on in one piece
            if calls and calls[-1].index == piece.index and piece.id is None:
                calls[-1] = replace(calls[-1], arguments=calls[-1].arguments + piece.arguments)
            else:
                calls.append(piece)
        return Delta(self.reasoning + after.reasoning, self.content + after.content, self.logprobs + after.logprobs,
                     after.finish_reason, tuple(calls))


def coalesce(deltas: list[Delta]) -> list[Delta]:
    """``deltas`` (of one choice, in order) as few as can be sent in their order: a speculative round's tokens, or
    what arrived while the server was busy, go out as one chunk rather than one each."""
    out: list[Delta] = []
    for delta in deltas:
        joined = out[-1].then(delta) if out else None
        if joined is None:
            out.append(delta)
        else:
            out[-1] = joined
    return out


@dataclass
class ChoiceState:
    """The sums of one choice so far; ``split`` is off for the completions endpoint (raw text); ``tools``: the
    tools offered, whose calls are read from the reply (None: ``<tool_call>`` is text).

    Text that may be the start of a stop string is held back until the next tokens
    show it is not (the engine's deltas carry it; its final text is cut before the
    stop string), so a client never sees any part of a stop string.
    """

    index: int
    split: bool = True
    stops: tuple[str, ...] = ()
    reasoning: str = ""
    content: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tokens: int = 0
    arrivals: list[float] = field(default_factory=list)  # when each token reached the server (perf_counter)
    finish_reason: str | None = None
    final: FinalEvent | None = None
    tools: list[dict] | None = None
    _raw: str = ""  # the reply's text as the engine's deltas spell it
    _sent: int = 0  # how much of it went out
    _parser: ReplyParser = field(init=False)
    _tails: StopTails = field(init=False)

    def __post_init__(self) -> None:
        self._tails = StopTails(self.stops)
        self._parser = ReplyParser(self.tools)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self._parser.calls

    def feed(self, event: Event) -> Delta:
        """What ``event`` adds (the sums grow by it)."""
        logprobs: tuple[TokenLogprob, ...] = ()
        hold = 0
        if isinstance(event, TokenEvent):
            self.tokens += 1
            self.arrivals.append(time.perf_counter())
            logprobs = (TokenLogprob(event.token, event.logprob, event.top_logprobs),)
            self.logprobs.append(logprobs[0])
            self._raw += event.text
            hold = self._tails.feed(event.text) if self._tails.stops else 0  # what may begin a stop string
        elif event.finish_reason == "stop":
            self._raw = event.text  # the engine's final text, cut before the stop string
        end = max(self._sent, len(self._raw) - hold)
        text, self._sent = self._raw[self._sent:end], end  # what is not sent yet, but what is held back
        parsed = self._parser.feed(text) if self.split else ParsedDelta(content=text)
        if isinstance(event, FinalEvent):
            parsed = self._finish(event, parsed)
        self.reasoning += parsed.reasoning
        self.content += parsed.content
        return Delta(parsed.reasoning, parsed.content, logprobs, self.finish_reason, parsed.calls)

    def _finish(self, event: FinalEvent, parsed: ParsedDelta) -> ParsedDelta:
        """The reply ended: its finish reason; ``parsed`` and what the parser held back."""
        self.final = event
        if self.split:
            more = self._parser.finish()
            parsed = ParsedDelta(parsed.reasoning + more.reasoning, parsed.content + more.content,
                                 parsed.calls + more.calls)
        self.finish_reason = FINISH_REASONS.get(event.finish_reason, "stop")
        if self.tool_calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"
        return parsed


class StopTails:
    """How much of each stop string's start the text so far ends with, kept up to date character by character
    (Knuth-Morris-Pratt), so that a token costs the same whatever the stop strings' lengths: checking every
    start of every stop string against the text's end would cost up to their lengths squared, per token."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self._borders = [_borders(stop) for stop in self.stops]
        self._matched = [0] * len(self.stops)

    def feed(self, text: str) -> int:
        """After ``text`` is added: the length of the longest end of the whole text that begins some stop string
        (a whole stop string excluded: that one ends the reply)."""
        longest = 0
        for i, (stop, borders) in enumerate(zip(self.stops, self._borders)):
            k = self._matched[i]
            for char in text:
                if k == len(stop):
                    k = borders[k - 1]
                while k and stop[k] != char:
                    k = borders[k - 1]
                k += stop[k] == char
            self._matched[i] = k
            longest = max(longest, borders[k - 1] if k == len(stop) else k)
        return longest


@lru_cache(maxsize=64)  # the n choices of a request share their stop strings
def _borders(stop: str) -> tuple[int, ...]:
    """``borders[i]``: the length of the longest proper start of ``stop[:i + 1]`` that is also its end."""
    borders, k = [0] * len(stop), 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = borders[k - 1]
        k += stop[i] == stop[k]
        borders[i] = k
    return tuple(borders)


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that begins some stop string (it may yet become one)."""
    return StopTails(stops).feed(text)


def usage(choices: list[ChoiceState], prompt_tokens: int) -> dict:
    """OpenAI's usage object; cached tokens are the prompt tokens found in the KV pool (prefix hits)."""
    completion = sum(choice.tokens for choice in choices)
    finals = [choice.final for choice in choices if choice.final is not None]
    cached = finals[0].stats.reused_tokens if finals else 0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}}


def chat_logprobs(entries: list[TokenLogprob], text_of: Callable[[int], str]) -> dict:
    """``choices[i].logprobs`` of the chat endpoint: one record per token, with its likeliest alternatives."""
    def record(token: int, logprob: float) -> dict:
        text = text_of(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [record(e.token, e.logprob) | {"top_logprobs": [record(t, lp) for t, lp in e.top]}
                        for e in entries]}


def completion_logprobs(entries: list[TokenLogprob], text_of: Callable[[int], str], offset: int = 0) -> dict:
    """``choices[i].logprobs`` of the legacy completions endpoint (parallel lists; offsets into the text)."""
    tokens = [text_of(e.token) for e in entries]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{text_of(t): lp for t, lp in e.top} for e in entries], "text_offset": offsets}
