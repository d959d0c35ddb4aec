"""``POST /v1/responses``: OpenAI's Responses API, stateless, as the chat endpoint.

Each request is translated into the chat endpoint's request (``responses_translate``)
and runs exactly as one: the same prompt, sampling, worker and errors; only the
reply is spelled as a ``response`` (``responses_replies``, ``responses_stream``).
Tools of types other than ``function`` are dropped: the log says so, and so does
the reply's ``X-Mlxchat-Dropped-Tools`` header (``docs/responses.md``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.serve.exchange import CLIENT_GONE, open_chat
from app.serve.ignored import ignored_header
from app.serve.responses_replies import whole_response
from app.serve.responses_schemas import ResponsesRequest
from app.serve.responses_stream import response_stream
from app.serve.responses_translate import translate
from app.serve.state import ServerState

router = APIRouter()
DROPPED_HEADER = "X-Mlxchat-Dropped-Tools"


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request) -> Response:
    state: ServerState = request.app.state.serve
    translated = translate(body)
    exchange, thinking = await open_chat(state, translated.chat)
    headers = {DROPPED_HEADER: ", ".join(sorted(set(translated.dropped)))} if translated.dropped else {}
    headers |= ignored_header(body)
    tokenizer = exchange.served.tokens.tokenizer

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    if body.stream:
        return response_stream(state, body, exchange, request.scope.setdefault("state", {}), thinking=thinking,
                               count=count, headers=headers)
    if not await exchange.wait(state, request):
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(whole_response(body, exchange.header, exchange.choices[0], exchange.usage(),
                                       thinking=thinking, count=count), headers=headers)
