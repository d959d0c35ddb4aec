"""Server-sent events for ``"stream": true``: a chunk per choice for the tokens that arrived together (one
token each, unless a speculative round's or the server was busy), then ``[DONE]``.

``relay`` is the one loop of every stream (OpenAI's here, Anthropic's in
``anthropic_stream.py``): it feeds the choices and cancels them when the stream
ends, however it ends; a ``Frames`` object spells the events of one API.

Chat streams begin with the assistant role, send the reasoning as
``reasoning_content`` deltas and the answer as ``content`` deltas, and end each
choice with its finish reason; with ``stream_options.include_usage`` a last chunk
carries the usage. An engine failure mid-stream (the status is sent already)
becomes an ``{"error": ...}`` event, which OpenAI's clients raise. When the
client disconnects, sse-starlette cancels the generator and ``finally`` cancels
every choice, so the scheduler frees their blocks at its next step. On SIGTERM
streams are not cut by sse-starlette: the server cancels their choices after a
grace period (``command._stop_on_signals``), so each still ends with its finish
reason ("cancelled") and ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import AppStatus

from app.serve.choices import ChoiceState, Delta, coalesce
from app.serve.errors import APIError, from_engine_error
from app.serve.exchange import Exchange
from app.serve.replies import chat_chunk, chat_role_chunk, completion_chunk, usage_chunk
from app.serve.running import cancel_all
from app.serve.state import ServerState
from mlxcore import RequestFailedError, RequestHandle

Chunk = Callable[[ChoiceState, Delta], dict]
AppStatus.disable_automatic_graceful_drain()  # see the module docstring: we end streams ourselves


def event(obj: dict | str, name: str | None = None) -> bytes:
    """One server-sent event (``name``: its ``event:`` line), encoded here: sse-starlette passes bytes through
    (per token, that saves work)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    head = f"event: {name}\r\n" if name else ""
    return f"{head}data: {data}\r\n\r\n".encode()


class Frames(Protocol):
    """How one API spells a stream: what comes first, the events of each delta, the end, a failure."""

    def opening(self) -> list[bytes]: ...

    def delta(self, choice: ChoiceState, delta: Delta) -> list[bytes]: ...

    def closing(self) -> list[bytes]: ...

    def failure(self, error: APIError) -> bytes: ...


@dataclass
class OpenAIFrames:
    """OpenAI's stream: ``first`` chunks, a chunk per event (one that adds only a logprob too), the usage chunk
    when asked for (``usage``), ``[DONE]``."""

    chunk: Chunk
    first: list[dict]
    usage: Callable[[], dict] | None

    def opening(self) -> list[bytes]:
        return [event(chunk) for chunk in self.first]

    def delta(self, choice: ChoiceState, delta: Delta) -> list[bytes]:
        return [event(self.chunk(choice, delta))]

    def closing(self) -> list[bytes]:
        return ([event(self.usage())] if self.usage else []) + [event("[DONE]")]

    def failure(self, error: APIError) -> bytes:
        return event(error.body())


async def relay(state: ServerState, exchange: Exchange, scope_state: dict, frames: Frames) -> AsyncIterator[bytes]:
    """The stream's events, spelled by ``frames``; whatever ends it, its choices end and it is logged."""
    outcome = "client gone"
    try:
        for first in frames.opening():
            yield first
        inbox = RequestHandle.read_all(exchange.handles)
        while inbox.open:
            sent: list[bytes] = []  # what arrived together goes out in one write
            for index, events in await inbox.arrived():
                choice = exchange.choices[index]
                for delta in coalesce([choice.feed(event) for event in events]):
                    sent += frames.delta(choice, delta)
            if sent:
                yield b"".join(sent)
        closing, outcome = frames.closing(), None
        for last in closing:
            yield last
    except RequestFailedError as error:
        outcome = "engine failed"
        yield frames.failure(from_engine_error(error))
    finally:
        cancel_all(exchange.handles)  # a no-op for choices that ended
        exchange.finish(state, scope_state, outcome)


def chat_stream(state: ServerState, exchange: Exchange, scope_state: dict, *, logprobs: bool,
                include_usage: bool) -> EventSourceResponse:
    head = exchange.header.object(chunk=True)
    text_of = exchange.served.tokens.token_text if logprobs else None
    chunk = partial(chat_chunk, head, text_of=text_of, usage_field=include_usage)
    opening = [chat_role_chunk(head, c.index, include_usage) for c in exchange.choices]
    frames = OpenAIFrames(chunk, opening, _usage(head, exchange, include_usage))
    return sse_response(state, relay(state, exchange, scope_state, frames))


def completion_stream(state: ServerState, exchange: Exchange, scope_state: dict, *, logprobs: bool,
                      include_usage: bool) -> EventSourceResponse:
    head = exchange.header.object(chunk=True)
    text_of = exchange.served.tokens.token_text if logprobs else None
    chunk = partial(completion_chunk, head, text_of=text_of, usage_field=include_usage)
    frames = OpenAIFrames(chunk, [], _usage(head, exchange, include_usage))
    return sse_response(state, relay(state, exchange, scope_state, frames))


def _usage(head: dict, exchange: Exchange, include_usage: bool) -> Callable[[], dict] | None:
    return (lambda: usage_chunk(head, exchange.usage())) if include_usage else None


def sse_response(state: ServerState, events: AsyncIterator[bytes],
                 ping: Callable[[], ServerSentEvent] | None = None) -> EventSourceResponse:
    """The stream of ``events``, with a keep-alive every ``--sse-ping-interval`` seconds (``ping``: the API's own
    event; default, a comment line, which every SSE client skips), so that a client's read timeout does not end
    it while the prompt is read or the request waits in the queue. A client that takes nothing for
    --stall-timeout is closed (its choices cancelled, with ``finally``), even one whose reply is done: what
    waits to be sent is held no longer than that."""
    return EventSourceResponse(events, headers={"Cache-Control": "no-cache"}, send_timeout=state.settings.stall_seconds,
                               ping=state.settings.ping_seconds, ping_message_factory=ping)
