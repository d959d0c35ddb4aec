"""Errors as OpenAI's API returns them: a status and ``{"error": {"message", "type", "param", "code"}}``
(on Anthropic's Messages paths, as Anthropic's API does: ``{"type": "error", "error": {"type", "message"}}``).

Every failure a client can meet ends here with a status that says whose fault it
is and a message that says what to do: 400 for a request we cannot serve
(with the field named), 401, 404, 408, 413, 429/503 with ``Retry-After`` when we are
full, 500 when the engine failed while the request ran.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from mlxcore import OverloadedError, PromptTooLongError
from mlxcore import RequestFailedError
from mlxcore import MlxchatError, PromptError
from app.flags import in_flags

log = logging.getLogger("mlxchat.serve")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}

# Anthropic's: our 429 (the queue is full) is its 529 "overloaded", which its clients retry after a pause
ANTHROPIC_PATH = "/v1/messages"
OVERLOADED = 529
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                    413: "request_too_large", 500: "api_error", 503: "api_error", OVERLOADED: "overloaded_error"}


class APIError(Exception):
    """A reply with ``status`` and an OpenAI-style error body; ``retry_after`` adds that header (seconds)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: float | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        """Anthropic's shape, for its Messages endpoints: ``{"type": "error", "error": {"type", "message"}}``."""
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.anthropic_status, "api_error"),
                                           "message": self.message}}

    @property
    def anthropic_status(self) -> int:
        return OVERLOADED if self.status == 429 else self.status

    def response(self, path: str = "") -> JSONResponse:
        """The reply, in Anthropic's shape and statuses on its paths (``path``), else in OpenAI's."""
        retry = {"Retry-After": str(max(1, math.ceil(self.retry_after)))} if self.retry_after else {}
        if path.startswith(ANTHROPIC_PATH):
            return JSONResponse(self.anthropic_body(), status_code=self.anthropic_status, headers=self.headers | retry)
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers | retry)


def from_engine_error(error: Exception) -> APIError:
    """The API error for what the scheduler or the engine raised for a request."""
    if isinstance(error, OverloadedError):
        return APIError(429, f"{in_flags(str(error))} Retry in {math.ceil(error.retry_after)} s.",
                        code="overloaded", retry_after=error.retry_after)
    if isinstance(error, PromptTooLongError):
        return APIError(400, in_flags(str(error)), param="messages", code="context_length_exceeded")
    if isinstance(error, RequestFailedError):
        if isinstance(error.__cause__, (OverloadedError, PromptTooLongError)):  # refused on the engine thread
            return from_engine_error(error.__cause__)
        return APIError(500, f"{in_flags(str(error))} See /health and the server's log.", code="engine_failed")
    if isinstance(error, (PromptError, MlxchatError)):
        return APIError(400, in_flags(str(error)))
    return APIError(500, f"Internal error: {type(error).__name__}: {error}")


def validation_error(error: RequestValidationError) -> APIError:
    """A 400 naming the first field that is wrong (``messages.1.role``), and what is wrong with it."""
    first = error.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(loc)
    if first.get("type") == "json_invalid":
        return APIError(400, f"The request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}.")
    if first.get("type") == "extra_forbidden":
        return APIError(400, f"Unsupported field {field!r}: mlxchat serve does not implement it (docs/serve.md, "
                             "Fields, lists those it takes).", param=field, code="unsupported_field")
    if first.get("type") == "missing":
        return APIError(400, f"Missing field {field!r}.", param=field)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    where = f"{field}: " if field else ""
    return APIError(400, f"Invalid request: {where}{message}.".replace("..", "."), param=field or None)


def _reply(request: Request, error: APIError) -> JSONResponse:
    """The error's response; its message also ends the request's log line."""
    request.scope.setdefault("state", {})["summary"] = f"error={error.message!r}"
    return error.response(request.url.path)


def install_handlers(app: FastAPI) -> None:
    """Turn every exception a route can raise into an OpenAI-style error reply."""

    @app.exception_handler(APIError)
    async def _api(request: Request, error: APIError) -> JSONResponse:
        return _reply(request, error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return _reply(request, validation_error(error))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        message = f"No route {request.method} {request.url.path}." if error.status_code in (404, 405) else \
            str(error.detail)
        return _reply(request, APIError(error.status_code, message, headers=error.headers))

    @app.exception_handler(MlxchatError)
    async def _engine(request: Request, error: MlxchatError) -> JSONResponse:
        return _reply(request, from_engine_error(error))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return _reply(request, from_engine_error(error))
