"""Anthropic's server-sent events for a streamed ``/v1/messages`` reply, on the one stream loop (``relay``).

``message_start`` (the message, empty) and a ``ping``; for each content block a
``content_block_start``, its ``content_block_delta``s (``thinking_delta``, then
``text_delta`` in the next block, ``input_json_delta`` in a ``tool_use`` block)
and a ``content_block_stop``; then
``message_delta`` with the stop reason and the usage, and ``message_stop``. A
failure once the stream has begun is an ``error`` event, as is a reply the
server's shutdown cut (Anthropic's clients raise it, and may retry).

The prefix hits are known only when the reply ends, so ``message_start``
reports the whole prompt as ``input_tokens``; ``message_delta`` carries the
final split (Anthropic's usage there is cumulative: clients take its figures).

A ``tool_use`` block is sent once its call parsed (``call_pieces``): Anthropic's
SDK parses each ``input_json_delta`` as it arrives, and raises on a call the
model wrote wrong; such a call's text comes as text instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sse_starlette import EventSourceResponse, ServerSentEvent

from app.serve.anthropic_replies import Decode, message_shell, message_usage, stop_reason, tool_use
from app.serve.call_pieces import CallPieces
from app.serve.choices import ChoiceState, Delta
from app.serve.errors import APIError
from app.serve.exchange import Exchange
from app.serve.running import shutting_down
from app.serve.state import ServerState
from app.serve.streaming import event, relay, sse_response


def _sse(obj: dict) -> bytes:
    return event(obj, obj["type"])  # Anthropic names each event by its type


@dataclass
class MessageFrames:
    """The ``Frames`` of one reply (a ``/v1/messages`` request has one choice): which block is open."""

    exchange: Exchange
    thinking: bool  # whether reasoning is sent (as a thinking block)
    decode: Decode  # token ids -> text: which stop sequence ended the reply
    _open: str | None = None  # the type of the open block
    _index: int = -1  # its index in the message's content
    _calls: CallPieces = field(default_factory=CallPieces)

    def opening(self) -> list[bytes]:
        usage = message_usage(self.exchange.usage(), cached_known=False)
        start = message_shell(self.exchange.header, [], usage, (None, None))
        return [_sse({"type": "message_start", "message": start}), _sse({"type": "ping"})]

    def delta(self, choice: ChoiceState, delta: Delta) -> list[bytes]:
        frames = []
        if delta.reasoning and self.thinking:
            frames += self._into("thinking", {"thinking": "", "signature": ""})
            frames.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.content:
            frames += self._into("text", {"text": ""})
            frames.append(self._delta({"type": "text_delta", "text": delta.content}))
        for call, pieces in self._calls.feed(choice, delta):
            frames += self._into("tool_use", tool_use(call, streamed=True), new=True)
            frames += [self._delta({"type": "input_json_delta", "partial_json": piece}) for piece in pieces]
        return frames

    def closing(self) -> list[bytes]:
        choice = self.exchange.choices[0]
        if choice.finish_reason == "cancelled":  # cut by the server's shutdown (a client that left reads nothing)
            return self._close() + [self.failure(shutting_down())]
        reason, sequence = stop_reason(choice, self.decode)
        end = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
               "usage": message_usage(self.exchange.usage())}
        return self._close() + [_sse(end), _sse({"type": "message_stop"})]

    def failure(self, error: APIError) -> bytes:
        return _sse(error.anthropic_body())

    def _into(self, kind: str, empty: dict, *, new: bool = False) -> list[bytes]:
        """Events that make ``kind`` the open block (``new``: a block of its own): close the open one, start
        the next."""
        if self._open == kind and not new:
            return []
        frames = self._close()
        self._open, self._index = kind, self._index + 1
        start = {"type": "content_block_start", "index": self._index, "content_block": {"type": kind} | empty}
        return frames + [_sse(start)]

    def _delta(self, delta: dict) -> bytes:
        return _sse({"type": "content_block_delta", "index": self._index, "delta": delta})

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [_sse({"type": "content_block_stop", "index": self._index})]


def message_stream(state: ServerState, exchange: Exchange, scope_state: dict, *, thinking: bool) -> EventSourceResponse:
    frames = MessageFrames(exchange, thinking, exchange.served.tokens.tokenizer.decode)
    return sse_response(state, relay(state, exchange, scope_state, frames), ping=_ping)


def _ping() -> ServerSentEvent:
    """Anthropic's keep-alive, as its API sends it."""
    return ServerSentEvent(data='{"type":"ping"}', event="ping")
