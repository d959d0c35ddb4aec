"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API, as the chat endpoint.

Each request is translated into the chat endpoint's request (``anthropic_translate``)
and runs exactly as one: the same prompt, sampling, worker and errors; only the
reply is spelled as Anthropic's (``anthropic_replies``, ``anthropic_stream``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.serve.anthropic_replies import message
from app.serve.anthropic_schemas import MessagesPrompt, MessagesRequest
from app.serve.anthropic_stream import message_stream
from app.serve.anthropic_translate import chat_body
from app.serve.exchange import CLIENT_GONE, open_chat
from app.serve.prompts import chat_prompt_ids
from app.serve.state import ServerState

router = APIRouter()


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request) -> Response:
    state: ServerState = request.app.state.serve
    exchange, thinking = await open_chat(state, chat_body(body))
    if body.stream:
        return message_stream(state, exchange, request.scope.setdefault("state", {}), thinking=thinking)
    if not await exchange.wait(state, request):
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(message(exchange.header, exchange.choices[0], exchange.usage(), thinking=thinking,
                                decode=exchange.served.tokens.tokenizer.decode))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: MessagesPrompt, request: Request) -> JSONResponse:
    """The prompt's tokens as ``/v1/messages`` would build it."""
    state: ServerState = request.app.state.serve
    chat = chat_body(body)
    async with state.models.use(chat.model) as served:
        ids = await chat_prompt_ids(chat, served.tokens, served.info, thinking=chat.thinking(state.settings.thinking),
                                    system=state.settings.system)
    return JSONResponse({"input_tokens": len(ids)})
