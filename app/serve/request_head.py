"""A request whose line and headers do not arrive in time closes its connection (a slow-loris client).

Uvicorn times out only idle keep-alive connections, and any byte received
cancels that timer: a client that sends its headers a byte at a time, half of
them, or nothing after connecting held a connection open forever. This is
uvicorn's httptools protocol (mlxchat depends on httptools) with one more
timer: armed when a connection opens and when a response completes, disarmed
when a request's headers are complete. The body has its own timeout
(``middleware.py``), and a long reply is not limited.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("mlxchat.serve")


def head_timeout_protocol(seconds: float) -> type[HttpToolsProtocol]:
    """Uvicorn's ``http`` protocol class, closing connections whose request head takes over ``seconds``."""

    class HeadTimeoutProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._disarm_head()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # then the next request's head is in already
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                self._arm_head()

        def _arm_head(self) -> None:
            self._disarm_head()
            self._head_timer = self.loop.call_later(seconds, self._head_too_slow)

        def _disarm_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                client = self.client[0] if self.client else "-"
                log.info("%s: no complete request head in %g s; connection closed", client, seconds)
                self.transport.close()

    return HeadTimeoutProtocol
