"""RequestHandle.read_all: the events of several handles, put by another thread, read in an asyncio loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mlxcore.batching.handle import RequestFailedError, RequestHandle
from mlxcore.batching.request import Request
from mlxcore.events import FinalEvent, GenerationStats, TokenEvent
from mlxcore.params import GenerationParams


def handle() -> RequestHandle:
    return RequestHandle(Request((1, 2, 3), GenerationParams(max_tokens=4)), lambda handle: None)


def token(i: int) -> TokenEvent:
    return TokenEvent(token=i, text=str(i), logprob=0.0)


def final() -> FinalEvent:
    return FinalEvent("length", "", GenerationStats())


async def read(handles: list[RequestHandle], engine: threading.Thread) -> list[tuple[int, object]]:
    inbox = RequestHandle.read_all(handles)
    engine.start()
    taken = []
    while inbox.open:
        for index, events in await inbox.arrived():
            taken += [(index, event.token if isinstance(event, TokenEvent) else "end") for event in events]
    return taken


def test_every_handles_events_arrive_in_order_with_their_index_and_none_stays_unread():
    first, second = handle(), handle()
    first.put(token(0))  # before the reader arrived: kept for it

    def engine() -> None:
        for i in range(1, 4):
            first.put(token(i))
            second.put(token(10 + i))
        first.put(final())
        second.put(final())

    taken = asyncio.run(read([first, second], threading.Thread(target=engine)))
    assert [t for index, t in taken if index == 0] == [0, 1, 2, 3, "end"]
    assert [t for index, t in taken if index == 1] == [11, 12, 13, "end"]
    assert first.unread == second.unread == 0  # what the engine pauses on: the reader took everything


def test_an_engine_failure_reaches_the_reader():
    failing, fine = handle(), handle()

    def engine() -> None:
        fine.put(token(1))
        failing.fail(RuntimeError("out of memory"))

    with pytest.raises(RequestFailedError, match="out of memory"):
        asyncio.run(read([failing, fine], threading.Thread(target=engine)))


def test_what_arrived_together_is_taken_at_once_and_a_failure_after_the_events_before_it():
    replying, failing = handle(), handle()

    async def reader() -> tuple[list, list]:
        inbox = RequestHandle.read_all([replying, failing])
        for i in range(5):  # a round's tokens, put before the reader looks
            replying.put(token(i))
        failing.put(token(7))
        first = [(index, [event.token for event in events]) for index, events in await inbox.arrived()]
        replying.put(token(5))
        failing.fail(RuntimeError("out of memory"))
        second = [(index, [event.token for event in events]) for index, events in await inbox.arrived()]
        with pytest.raises(RequestFailedError, match="out of memory"):
            await inbox.arrived()
        return first, second

    first, second = asyncio.run(reader())
    assert first == [(0, [0, 1, 2, 3, 4]), (1, [7])]
    assert second == [(0, [5])]  # the events before the failure are read first
    assert replying.unread == 0
