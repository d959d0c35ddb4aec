"""Submitting a request to the scheduler and following its choices from the event loop.

A client that goes away, streaming or not, cancels every choice of its request:
streams notice it when sse-starlette cancels their generator; non-streaming
requests watch the connection (``reply_unless_gone``) while they wait.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request as HTTPRequest

from app.serve.choices import ChoiceState
from app.serve.errors import APIError, from_engine_error
from mlxcore import OverloadedError, PromptTooLongError
from mlxcore import RequestFailedError, RequestHandle
from mlxcore import Request


def submit(worker, request: Request, n: int) -> list[RequestHandle]:
    """The handles of the ``n`` choices (which share the prompt's blocks); API errors when refused."""
    if not worker.alive:
        raise engine_down(worker)
    try:
        return worker.submit_choices(request, n) if n > 1 else [worker.submit(request)]
    except (OverloadedError, PromptTooLongError) as error:
        raise from_engine_error(error) from None
    except RequestFailedError:
        raise engine_down(worker) from None


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down: this reply was cut. Retry once it is back.",
                    code="server_shutting_down", retry_after=5)


def engine_down(worker) -> APIError:
    return APIError(503, f"The engine has stopped ({worker.failure}); this server cannot answer until it is "
                         "restarted. See its log.", code="engine_failed")


def cancel_all(handles: list[RequestHandle]) -> None:
    for handle in handles:
        handle.cancel()  # a no-op once it finished


async def follow(handles: list[RequestHandle], choices: list[ChoiceState]) -> None:
    """Feed every event to its choice until all choices end."""
    inbox = RequestHandle.read_all(handles)
    while inbox.open:
        for index, events in await inbox.arrived():
            for event in events:
                choices[index].feed(event)


async def until_disconnected(request: HTTPRequest) -> None:
    """Returns when the client closes the connection (the body has been read, so only that can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def reply_unless_gone(request: HTTPRequest, handles: list[RequestHandle], choices: list[ChoiceState]) -> bool:
    """Wait for every choice to end; if the client leaves first, cancel them all and return False."""
    work = asyncio.create_task(follow(handles, choices))
    watch = asyncio.create_task(until_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            work.result()  # raises RequestFailedError if the engine failed
            return True
        return False
    except RequestFailedError as error:
        raise from_engine_error(error) from None
    finally:
        watch.cancel()
        work.cancel()
        cancel_all(handles)
