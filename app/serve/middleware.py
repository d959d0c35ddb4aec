"""What every HTTP request passes through: the API key (401; as a bearer token or Anthropic's ``x-api-key``), a
stalled body (408), the body limit (413), one log line, counters.

A plain ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``, which
would wrap ``receive`` and hide a client's disconnect from the routes.

A client that stops in the middle of its body would hold its connection (and a
route waiting for the body) forever: while a body is still coming, each read
waits at most ``body_timeout_s`` seconds (``--read-timeout``; like nginx's
client_body_timeout), then the answer is 408 and the connection closes. The
request line and headers have the same limit (``request_head.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.serve.errors import APIError
from app.serve.metrics import ServerMetrics

log = logging.getLogger("mlxchat.serve")
OPEN_PATHS = ("/health",)  # answered without the API key: a load balancer's probe has none
DRAIN_BYTES = 64 * 2**20  # a refused body is read (and dropped) up to this size; beyond it the connection closes
CLOSE = {"Connection": "close"}  # after a body we did not read to its end, the connection cannot serve another
BEARER = "bearer"  # the scheme of 'Authorization: Bearer KEY', any case (RFC 9110 section 11.1)


class ServeMiddleware:
    """See the module docstring; ``scope["state"]["summary"]``, set by a route, ends its log line."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics,
                 body_timeout_s: float) -> None:
        self.app, self.api_key, self.max_body_bytes, self.metrics = app, api_key, max_body_bytes, metrics
        self.body_timeout_s = body_timeout_s  # the longest pause within a body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]
        scope.setdefault("state", {})

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        timed = _timed(receive, self.body_timeout_s)
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                if not await _drain(timed):
                    refusal.headers |= CLOSE
                await refusal.response(scope["path"])(scope, receive, sent)
            else:
                await self.app(scope, self._limited(timed), sent)
        finally:
            self._record(scope, status[0], time.perf_counter() - start)

    def _refusal(self, scope: Scope) -> APIError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            given = _keys(headers)
            ask = {"WWW-Authenticate": "Bearer"}  # which scheme to retry with (RFC 9110 section 11.6.1)
            if not given:
                return APIError(401, "Missing API key: send it as 'Authorization: Bearer KEY' (or 'x-api-key: "
                                     "KEY').", code="no_api_key", headers=ask)
            if not any(hmac.compare_digest(key.encode("latin-1"), self.api_key.encode()) for key in given):
                return APIError(401, "Wrong API key.", code="invalid_api_key", headers=ask)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> APIError:
        return APIError(413, f"The request body is larger than this server's limit of {self.max_body_bytes:,} "
                             "bytes (--max-body).", code="body_too_large")

    def _limited(self, receive: Receive) -> Receive:
        """``receive``, failing with 413 once a body without a Content-Length outgrows the limit."""
        seen = [0]

        async def limited() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body_bytes:
                    drained = not message.get("more_body") or await _drain(receive)
                    raise HTTPException(413, self._too_large().message, headers=None if drained else CLOSE)
            return message

        return limited

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "other"
        self.metrics.observe_http(endpoint, status, seconds)
        client = scope.get("client") or ("-", 0)
        summary = scope["state"].get("summary", "")
        log.info("%s %s %s %d %.3fs%s", client[0], scope["method"], scope["path"], status, seconds,
                 f" {summary}" if summary else "")


def _keys(headers: dict[str, str]) -> list[str]:
    """The keys a request presents: OpenAI's clients send 'Authorization: Bearer KEY', Anthropic's 'x-api-key:
    KEY' (or the bearer form, as Claude Code does with ANTHROPIC_AUTH_TOKEN). Another scheme presents ''."""
    keys = [headers["x-api-key"].strip()] if "x-api-key" in headers else []
    if headers.get("authorization"):
        scheme, _, key = headers["authorization"].partition(" ")
        keys.append(key.strip() if scheme.lower() == BEARER else "")
    return keys


async def _drain(receive: Receive, limit: int = DRAIN_BYTES) -> bool:
    """Read and drop the rest of a refused body (up to ``limit`` bytes), so that the client reads our answer:
    closing a socket with unread data in it resets the connection under the client's feet. False when the
    body stalled or went over ``limit``: then the connection must close after the answer."""
    seen = 0
    try:
        while seen <= limit:
            message = await receive()
            seen += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                return True
    except HTTPException:  # stalled (``_timed``)
        pass
    return False


def _timed(receive: Receive, seconds: float) -> Receive:
    """``receive``, failing with 408 when a body that is still coming pauses longer than ``seconds``; once the
    body is in, it waits as long as it takes (a route waits on it for the client's disconnect)."""
    coming = [True]

    async def timed() -> Message:
        if not coming[0]:
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), seconds)
        except asyncio.TimeoutError:
            raise HTTPException(408, f"The request body did not arrive: nothing came for {seconds:g} s.",
                                headers=CLOSE) from None
        coming[0] = message["type"] == "http.request" and message.get("more_body", False)
        return message

    return timed
