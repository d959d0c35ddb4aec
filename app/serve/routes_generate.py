"""``POST /v1/chat/completions`` and ``POST /v1/completions``, streaming or not."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.serve.errors import APIError
from app.serve.exchange import Exchange
from app.serve.prompts import chat_request, completion_request
from app.serve.replies import chat_completion, text_completion
from app.serve.running import reply_unless_gone, shutting_down
from app.serve.schemas import ChatCompletionRequest, CompletionRequest
from app.serve.state import ServerState
from app.serve.streaming import chat_stream, completion_stream

router = APIRouter()
CLIENT_GONE = 499  # nginx's status for a client that closed the connection first (nothing is sent)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.serve
    state.check_model(body.model)
    thinking = body.thinking(state.settings.thinking)
    scheduled = await chat_request(body, state.tokens, state.model, thinking=thinking, system=state.settings.system)
    exchange = Exchange.open(state, scheduled, kind="chat", n=body.n, split=True, user=body.user)
    if body.stream:
        return chat_stream(state, exchange, request.scope.setdefault("state", {}), logprobs=body.logprobs,
                           include_usage=body.include_usage)
    if not await _wait(state, exchange, request):
        return Response(status_code=CLIENT_GONE)
    text_of = state.tokens.token_text if body.logprobs else None
    return JSONResponse(chat_completion(exchange.header, exchange.choices, exchange.usage(),
                                        thinking=thinking, text_of=text_of))


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.serve
    state.check_model(body.model)
    scheduled = await completion_request(body, state.tokens, state.model)
    exchange = Exchange.open(state, scheduled, kind="completion", n=body.n, split=False, user=body.user)
    logprobs = body.logprobs is not None
    if body.stream:
        return completion_stream(state, exchange, request.scope.setdefault("state", {}), logprobs=logprobs,
                                 include_usage=body.include_usage)
    if not await _wait(state, exchange, request):
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(text_completion(exchange.header, exchange.choices, exchange.usage(),
                                        text_of=state.tokens.token_text if logprobs else None))


async def _wait(state: ServerState, exchange: Exchange, request: Request) -> bool:
    """Follow every choice to its end; False (all cancelled) if the client left first. A reply cut by
    the server's shutdown is OpenAI's error JSON (503), not a partial reply."""
    outcome = "client gone"
    try:
        done = await reply_unless_gone(request, exchange.handles, exchange.choices, exchange.clock)
        outcome = None if done else outcome
        if done and state.stopping.is_set() and any(c.finish_reason == "cancelled" for c in exchange.choices):
            raise shutting_down()
        return done
    except APIError as error:  # the engine refused the request, or failed while it ran
        outcome = f"error {error.status}"
        raise
    finally:
        exchange.finish(state, request.scope.setdefault("state", {}), outcome)
