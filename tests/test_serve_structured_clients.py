"""Structured output as the client libraries of today ask for it, each against a real `mlxchat serve` on a
loopback port: instructor (tools and JSON-schema modes), pydantic-ai's structured output, LangChain's
``with_structured_output`` and ``bind_tools``, and the openai SDK's ``parse()``. Each asks for the same pydantic
model, written as users write one (an ``int``, a ``float``, a ``Literal`` and a nested object, no bounds, no
``extra="forbid"``), and reads the reply as its users do: every one of REPLIES replies must parse and validate.

On the embedded pair and on a random-weight twin (whose tokens are noise: only the grammar keeps a reply in the
schema and brings it to an end), at temperature 0 and 0.8. The server runs with ``--no-think`` (as the reply
is JSON, and a twin's thinking would run to the cap), the REPLIES requests of a case go at once (one batch), each
with a question of its own (at temperature 0 the same question would give the same reply REPLIES times).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import instructor
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from serve_process import MODEL, PAIR, ServeProcess
from twin_fixtures import twin_06b_f32, twins_root  # noqa: F401

pytestmark = pytest.mark.slow

REPLIES = 20
MAX_TOKENS = 160  # a valid reply is ~40 tokens (a tool call's wrapping included)
TIMEOUT = 300  # seconds for one request: REPLIES run as one batch on two shared cores


class Place(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    floor: int


class Answer(BaseModel):
    rooms: int
    distance: float
    unit: Literal["m", "km"]
    place: Place


def question(i: int) -> str:
    return f"Flat {i}: how many rooms, how far from the station, in which city, on which floor?"


Ask = Callable[[ServeProcess, str, float, str], Answer]


def _messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def instructor_ask(mode: instructor.Mode) -> Ask:
    def ask(server: ServeProcess, model: str, temperature: float, text: str) -> Answer:
        client = instructor.from_openai(server.client(timeout=TIMEOUT), mode=mode)
        return client.chat.completions.create(model=model, response_model=Answer, max_retries=0, messages=_messages(text),
                                              max_tokens=MAX_TOKENS, temperature=temperature)
    return ask


def openai_parse(server: ServeProcess, model: str, temperature: float, text: str) -> Answer:
    reply = server.client(timeout=TIMEOUT).chat.completions.parse(
        model=model, messages=_messages(text), response_format=Answer, max_tokens=MAX_TOKENS, temperature=temperature)
    parsed = reply.choices[0].message.parsed
    assert parsed is not None, f"no parsed reply: {reply.choices[0]}"
    return parsed


def _chat_openai(server: ServeProcess, model: str, temperature: float) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=f"{server.url}/v1", api_key="none", temperature=temperature,
                      max_tokens=MAX_TOKENS, max_retries=0, timeout=TIMEOUT)


def langchain_structured(server: ServeProcess, model: str, temperature: float, text: str) -> Answer:
    return _chat_openai(server, model, temperature).with_structured_output(Answer).invoke(text)


def langchain_bind_tools(server: ServeProcess, model: str, temperature: float, text: str) -> Answer:
    reply = _chat_openai(server, model, temperature).bind_tools([Answer], tool_choice="Answer").invoke(text)
    assert len(reply.tool_calls) == 1, f"not one call: {reply.tool_calls}, {reply.invalid_tool_calls}"
    return Answer.model_validate(reply.tool_calls[0]["args"])


def pydantic_ai_agent(server: ServeProcess, model: str) -> Agent:
    provider = OpenAIProvider(base_url=f"{server.url}/v1", api_key="none")
    return Agent(OpenAIChatModel(model, provider=provider), output_type=Answer, retries=0)


ASKS: dict[str, Ask] = {
    "instructor_tools": instructor_ask(instructor.Mode.TOOLS),
    "instructor_json_schema": instructor_ask(instructor.Mode.JSON_SCHEMA),
    "openai_parse": openai_parse,
    "langchain_with_structured_output": langchain_structured,
    "langchain_bind_tools": langchain_bind_tools,
    "pydantic_ai": None,  # asynchronous: ``replies`` runs its agent's requests together on one event loop
}


@pytest.fixture(scope="module", params=["embedded", "twin"])
def served(request, tmp_path_factory) -> tuple[ServeProcess, str]:
    """(server, model name): the embedded pair, or the 0.6B twin alone."""
    tmp = tmp_path_factory.mktemp(f"structured-clients-{request.param}")
    if request.param == "embedded":
        pair, name = PAIR, MODEL
    else:
        folder = request.getfixturevalue("twin_06b_f32")
        pair, name = ("--model", str(folder), "--no-draft"), folder.name
    with ServeProcess(tmp, "--no-think", "--max-running", str(REPLIES), pair=pair) as server:
        yield server, name


def replies(client: str, server: ServeProcess, model: str, temperature: float) -> list[Answer | BaseException]:
    """REPLIES answers (or what each raised), asked at once."""
    if client == "pydantic_ai":
        agent = pydantic_ai_agent(server, model)
        settings = {"temperature": temperature, "max_tokens": MAX_TOKENS, "timeout": TIMEOUT}

        async def all_runs() -> list:
            runs = [agent.run(question(i), model_settings=settings) for i in range(REPLIES)]
            return [r if isinstance(r, BaseException) else r.output
                    for r in await asyncio.gather(*runs, return_exceptions=True)]
        return asyncio.run(all_runs())

    def one(i: int) -> Answer | BaseException:
        try:
            return ASKS[client](server, model, temperature, question(i))
        except Exception as error:  # what the client raised: counted, and the first shown
            return error
    with ThreadPoolExecutor(REPLIES) as pool, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (LangChain's and instructor's deprecation notes)
        return list(pool.map(one, range(REPLIES)))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("client", list(ASKS))
def test_every_reply_parses_and_validates(served, client, temperature):
    server, model = served
    got = replies(client, server, model, temperature)
    failed = [reply for reply in got if not isinstance(reply, Answer)]
    assert not failed, f"{len(failed)} of {REPLIES} replies failed; the first: {str(failed[0])[:600]}"
