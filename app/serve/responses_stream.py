"""The Responses API's server-sent events for a streamed ``/v1/responses`` reply, on the one stream loop (``relay``).

``response.created`` and ``response.in_progress`` (the response, no output yet);
then per output item, in the order the model writes them:

- reasoning: ``response.output_item.added``, ``response.reasoning_text.delta``s,
  ``response.reasoning_text.done``, ``response.output_item.done``;
- text: ``response.output_item.added`` (a message), ``response.content_part.added``,
  ``response.output_text.delta``s, ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``;
- a call, once it parsed (``call_pieces``): ``response.output_item.added``,
  ``response.function_call_arguments.delta``s (the pieces as generated),
  ``response.function_call_arguments.done``, ``response.output_item.done``;

and last ``response.completed`` (``response.incomplete`` when cut at
``max_output_tokens``) with the whole response and its usage. Every event has
its ``sequence_number``. A failure once the stream has begun, or a reply the
server's shutdown cut, is an ``error`` event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sse_starlette import EventSourceResponse

from app.serve.call_pieces import CallPieces
from app.serve.choices import ChoiceState, Delta
from app.serve.errors import APIError
from app.serve.exchange import Exchange
from app.serve.replies import ReplyHeader
from app.serve.responses_replies import (CountTokens, ResponseIds, function_call_item, message_item, output_text,
                                         reasoning_item, response_object, response_usage, status)
from app.serve.responses_schemas import ResponsesRequest
from app.serve.running import shutting_down
from app.serve.state import ServerState
from app.serve.streaming import event, relay, sse_response
from mlxcore import ToolCall


@dataclass
class ResponseFrames:
    """The ``Frames`` of one reply (a Responses request has one choice): the items sent and the one open."""

    body: ResponsesRequest
    exchange: Exchange
    thinking: bool  # whether reasoning is sent (as a reasoning item)
    count: CountTokens  # the reasoning's tokens, for usage
    _sequence: int = 0
    _items: list[dict] = field(default_factory=list)  # the items done
    _open: str | None = None  # "reasoning" or "message": the item being written
    _text: str = ""  # its text so far
    _calls: CallPieces = field(default_factory=CallPieces)

    @property
    def header(self) -> ReplyHeader:
        return self.exchange.header

    @property
    def ids(self) -> ResponseIds:
        return ResponseIds(self.header.id)

    def opening(self) -> list[bytes]:
        shell = response_object(self.body, self.header, self.ids, state="in_progress", output=[], usage=None)
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def delta(self, choice: ChoiceState, delta: Delta) -> list[bytes]:
        frames = []
        if delta.reasoning and self.thinking:
            frames += self._into("reasoning")
            frames.append(self._event("response.reasoning_text.delta", **self._where(), delta=delta.reasoning))
            self._text += delta.reasoning
        if delta.content:
            frames += self._into("message")
            frames.append(self._event("response.output_text.delta", **self._where(), delta=delta.content,
                                      logprobs=[]))
            self._text += delta.content
        for call, pieces in self._calls.feed(choice, delta):
            frames += self._call(call, pieces)
        return frames

    def closing(self) -> list[bytes]:
        choice = self.exchange.choices[0]
        frames = self._close()
        if choice.finish_reason == "cancelled":  # cut by the server's shutdown
            return frames + [self.failure(shutting_down())]
        state, details = status(choice)
        usage = response_usage(self.exchange.usage(), self.count(choice.reasoning) if choice.reasoning else 0)
        whole = response_object(self.body, self.header, self.ids, state=state, output=self._items, usage=usage,
                                details=details)
        return frames + [self._event(f"response.{state}", response=whole)]

    def failure(self, error: APIError) -> bytes:
        return self._event("error", code=error.code, message=error.message, param=error.param)

    def _event(self, kind: str, **fields) -> bytes:
        self._sequence += 1
        return event({"type": kind, "sequence_number": self._sequence - 1} | fields, kind)

    def _where(self, content: bool = True) -> dict:
        """Where an event belongs: the open item's id and place (and its one content part)."""
        index = len(self._items)
        prefix = "rs" if self._open == "reasoning" else "msg"
        return {"item_id": self.ids.item(prefix, index), "output_index": index} | ({"content_index": 0}
                                                                                   if content else {})

    def _into(self, kind: str) -> list[bytes]:
        """Events that make ``kind`` the open item: close the open one, add the next."""
        if self._open == kind:
            return []
        frames = self._close()
        self._open, self._text = kind, ""
        where = self._where(content=False)
        if kind == "reasoning":
            return frames + [self._event("response.output_item.added", output_index=where["output_index"],
                                         item=reasoning_item(where["item_id"], "", done=False))]
        return frames + [self._event("response.output_item.added", output_index=where["output_index"],
                                     item=message_item(where["item_id"], None)),
                         self._event("response.content_part.added", **self._where(), part=output_text(""))]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        where, text = self._where(), self._text
        if self._open == "reasoning":
            item = reasoning_item(where["item_id"], text)
            frames = [self._event("response.reasoning_text.done", **where, text=text)]
        else:
            item = message_item(where["item_id"], text)
            frames = [self._event("response.output_text.done", **where, text=text, logprobs=[]),
                      self._event("response.content_part.done", **where, part=output_text(text))]
        frames.append(self._event("response.output_item.done", output_index=where["output_index"], item=item))
        self._items.append(item)
        self._open = None
        return frames

    def _call(self, call: ToolCall, pieces: list[str]) -> list[bytes]:
        """A parsed call's events, its item added and done."""
        frames = self._close()
        index = len(self._items)
        item_id = self.ids.item("fc", index)
        where = {"item_id": item_id, "output_index": index}
        frames.append(self._event("response.output_item.added", output_index=index,
                                  item=function_call_item(item_id, call, arguments="")))
        frames += [self._event("response.function_call_arguments.delta", **where, delta=piece) for piece in pieces]
        item = function_call_item(item_id, call)
        frames += [self._event("response.function_call_arguments.done", **where, name=call.name,
                               arguments=call.arguments),
                   self._event("response.output_item.done", output_index=index, item=item)]
        self._items.append(item)
        return frames


def response_stream(state: ServerState, body: ResponsesRequest, exchange: Exchange, scope_state: dict, *,
                    thinking: bool, count: CountTokens, headers: dict[str, str]) -> EventSourceResponse:
    frames = ResponseFrames(body, exchange, thinking, count)
    response = sse_response(state, relay(state, exchange, scope_state, frames))
    response.headers.update(headers)
    return response
