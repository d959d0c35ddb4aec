"""``POST /v1/chat/completions`` and ``POST /v1/completions``, streaming or not."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.serve.exchange import CLIENT_GONE, Exchange, open_chat
from app.serve.ignored import ignored_header
from app.serve.prompts import completion_request
from app.serve.replies import chat_completion, text_completion
from app.serve.schemas import ChatCompletionRequest, CompletionRequest
from app.serve.state import ServerState
from app.serve.streaming import chat_stream, completion_stream

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.serve
    exchange, thinking = await open_chat(state, body)
    headers = ignored_header(body)
    if body.stream:
        response = chat_stream(state, exchange, request.scope.setdefault("state", {}), logprobs=body.logprobs,
                               include_usage=body.include_usage)
        response.headers.update(headers)
        return response
    if not await exchange.wait(state, request):
        return Response(status_code=CLIENT_GONE)
    text_of = exchange.served.tokens.token_text if body.logprobs else None
    return JSONResponse(chat_completion(exchange.header, exchange.choices, exchange.usage(),
                                        thinking=thinking, text_of=text_of), headers=headers)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.serve
    async with state.models.use(body.model, body.keep_alive_seconds) as served:
        scheduled = await completion_request(body, served.tokens, served.info)
        exchange = Exchange.open(state, served, scheduled, kind="completion", n=body.n, split=False, user=body.user)
    logprobs = body.logprobs is not None
    if body.stream:
        return completion_stream(state, exchange, request.scope.setdefault("state", {}), logprobs=logprobs,
                                 include_usage=body.include_usage)
    if not await exchange.wait(state, request):
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(text_completion(exchange.header, exchange.choices, exchange.usage(),
                                        text_of=served.tokens.token_text if logprobs else None))
