"""``POST /v1/sessions/{name}/save`` and ``POST /v1/sessions/{name}/restore`` (see ``session_jobs``).

The jobs touch the Engine, so they run on its thread through ``worker.call``,
between two scheduler steps; the route waits for them on a helper thread, so
the event loop keeps streaming meanwhile.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from app.serve.errors import APIError, from_engine_error
from app.serve.prompts import prompt_ids, with_empty_blocks
from app.serve.choices import ChoiceState
from app.serve.running import engine_down, reply_unless_gone, submit
from app.serve.registry import ServedModel
from app.serve.schemas import SessionSaveRequest
from app.serve.session_jobs import is_session_name, save_request
from app.serve.state import ServerState
from mlxcore import RequestFailedError
from mlxcore import MlxchatError
from mlxcore import PoolExhaustedError
from mlxcore import DistributedError
from sessions import SessionFileError, SessionInUseError, SessionNotFoundError, SessionSaveError
from sessions import ThinkingSplitter

router = APIRouter()
JOB_TIMEOUT_S = 600.0  # a save prefills the conversation: long ones on big models take a while


def _checked(name: str) -> str:
    if not is_session_name(name):
        raise APIError(400, f"{name!r} is not a session name: use letters, digits, '-' and '_' (at most 64, "
                            "starting with a letter or digit), no paths or dots.", param="name")
    return name


async def _run(served: ServedModel, job, *args):
    if not served.worker.alive:
        raise engine_down(served.worker)
    try:
        return await run_in_threadpool(served.worker.call, lambda engine: job(engine, *args), JOB_TIMEOUT_S)
    except MlxchatError as error:
        raise _session_error(error) from None


def _session_error(error: MlxchatError) -> APIError:
    if isinstance(error, SessionNotFoundError):
        return APIError(404, str(error), code="session_not_found")
    if isinstance(error, SessionInUseError):
        return APIError(409, str(error), code="session_in_use")
    if isinstance(error, SessionSaveError):
        return APIError(500, str(error), code="session_not_saved")
    if isinstance(error, SessionFileError):
        return APIError(422, str(error), code="session_file_error")
    if isinstance(error, PoolExhaustedError):
        return APIError(503, f"{error} Retry when fewer requests run.", code="kv_full", retry_after=5)
    if isinstance(error, RequestFailedError):
        return APIError(503, str(error), code="engine_failed")
    if isinstance(error, DistributedError):  # the store is rank 0's; the KV heads are every rank's
        return APIError(501, f"Saved sessions are not served yet while the model runs over several ranks: {error}",
                        code="not_implemented")
    return from_engine_error(error)


@router.post("/v1/sessions/{name}/save")
async def save(name: str, body: SessionSaveRequest, request: Request) -> dict:
    """Store the conversation (as the chat requests render it, so that the cache matches them). Its tokens
    are read by the scheduler like a chat request's prompt (paced: running streams do not stall); the
    store is written on the engine thread."""
    state: ServerState = request.app.state.serve
    name = _checked(name)
    thinking = body.thinking(state.settings.thinking)
    messages = [m.as_dict() for m in body.messages]
    messages = messages if thinking else with_empty_blocks(messages)
    async with state.models.use(state.started) as served:  # sessions are the started model's
        tokens = served.tokens
        text = await tokens.chat_text(messages, thinking, add_generation_prompt=messages[-1]["role"] != "assistant")
        ids = await prompt_ids(text, tokens, served.info, "messages")  # refused early if certainly too long
        caches = await _read(served, ids, request)
        return await _run(served, served.sessions.save, name, messages, thinking, body.title, caches, len(ids))


async def _read(served: ServedModel, ids: list[int], request: Request):
    """The caches holding ``ids``, read by the scheduler (``save_request``); cancelled if the client leaves."""
    handles = submit(served.worker, save_request(ids), 1)
    choices = [ChoiceState(0, False, ())]
    done = await reply_unless_gone(request, handles, choices)
    if not done or handles[0].caches is None:
        raise APIError(503, "The conversation was not read (the request was cancelled): nothing was saved.",
                       code="session_not_saved")
    return handles[0].caches


@router.post("/v1/sessions/{name}/restore")
async def restore(name: str, request: Request) -> dict:
    """The stored conversation, its replies as a chat reply gives them (reasoning apart), to send on."""
    state: ServerState = request.app.state.serve
    name = _checked(name)
    async with state.models.use(state.started) as served:
        restored = await _run(served, served.sessions.restore, name)
    return restored | {"messages": [_as_client_sends(m) for m in restored["messages"]]}


def _as_client_sends(message: dict) -> dict:
    if message["role"] != "assistant":
        return message
    splitter = ThinkingSplitter()
    reasoning, answer = splitter.feed(message["content"])
    more = splitter.finish()
    reasoning, answer = reasoning + more[0], answer + more[1]
    return message | {"content": answer} | ({"reasoning_content": reasoning} if reasoning.strip() else {})
