"""Server-sent events for ``"stream": true``: one chunk per token of each choice, then ``[DONE]``.

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

from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus

from app.serve.choices import ChoiceState, Delta
from app.serve.errors import from_engine_error
from app.serve.exchange import Exchange
from app.serve.replies import chat_chunk, chat_role_chunk, completion_chunk, usage_chunk
from app.serve.running import cancel_all, merged
from app.serve.state import ServerState
from mlxcore.batching.handle import RequestFailedError

Chunk = Callable[[ChoiceState, Delta], dict]
AppStatus.disable_automatic_graceful_drain()  # see the module docstring: we end streams ourselves


def event(obj: dict | str) -> bytes:
    """One server-sent event, encoded here: sse-starlette passes bytes through (per token, that saves work)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\r\n\r\n".encode()


async def _events(state: ServerState, exchange: Exchange, scope_state: dict, chunk: Chunk, *,
                  opening: list[dict], include_usage: bool, keep_empty: bool) -> AsyncIterator[bytes]:
    """The stream's events: ``opening``, a chunk per delta, the usage, ``[DONE]``."""
    outcome = "client gone"
    try:
        for first in opening:
            yield event(first)
        async for index, item in merged(exchange.handles):
            exchange.clock.tick(index, item)
            choice = exchange.choices[index]
            delta = choice.feed(item)
            if not delta.empty or keep_empty:
                yield event(chunk(choice, delta))
        if include_usage:
            yield event(usage_chunk(exchange.header, exchange.usage()))
        outcome = None
        yield event("[DONE]")
    except RequestFailedError as error:
        outcome = "engine failed"
        yield event(from_engine_error(error).body())
    finally:
        cancel_all(exchange.handles)  # a no-op for choices that ended
        exchange.finish(state, scope_state, outcome)


def chat_stream(state: ServerState, exchange: Exchange, scope_state: dict, *, logprobs: bool,
                include_usage: bool) -> EventSourceResponse:
    text_of = state.tokens.token_text if logprobs else None

    def chunk(choice: ChoiceState, delta: Delta) -> dict:
        return chat_chunk(exchange.header, choice.index, delta, text_of=text_of, usage_field=include_usage)

    opening = [chat_role_chunk(exchange.header, c.index, include_usage) for c in exchange.choices]
    return _response(state, _events(state, exchange, scope_state, chunk, opening=opening,
                                    include_usage=include_usage, keep_empty=logprobs))


def completion_stream(state: ServerState, exchange: Exchange, scope_state: dict, *, logprobs: bool,
                      include_usage: bool) -> EventSourceResponse:
    text_of = state.tokens.token_text if logprobs else None

    def chunk(choice: ChoiceState, delta: Delta) -> dict:
        offset = len(choice.content) - len(delta.content)  # where this delta starts in the choice's text
        return completion_chunk(exchange.header, choice.index, delta, text_of=text_of, usage_field=include_usage,
                                offset=offset)

    return _response(state, _events(state, exchange, scope_state, chunk, opening=[], include_usage=include_usage,
                                    keep_empty=logprobs))


def _response(state: ServerState, events: AsyncIterator[bytes]) -> EventSourceResponse:
    # sse-starlette's pings (a comment line every 15 s) keep a proxy from closing a stream that waits in the queue.
    # A client that takes nothing for --stall-timeout is closed (its choices cancelled, with ``finally``), even
    # one whose reply is done: what waits to be sent is held no longer than that.
    return EventSourceResponse(events, headers={"Cache-Control": "no-cache"}, send_timeout=state.settings.stall_seconds)
