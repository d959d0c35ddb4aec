"""A request's grammar, built and compiled for its model once, off the event loop, before it is admitted.

llguidance's work grows with the schema (its limits are checked first, in the
request body: ``mlxcore.check_schema``), and compiling drops the GIL, so it runs
on a pool of ``COMPILING`` threads: the streams and ``/health`` go on meanwhile,
and more schemas at once wait their turn instead of taking every core. A grammar
that cannot be compiled, or that no reply can match, is a 400 naming it, before
the engine sees the request (so it never counts as an engine failure); one
slower than ``COMPILE_SECONDS`` is a 400 too (its thread ends on its own later).
The engine takes the compiled matcher, one copy per reply, so one compiled
grammar serves every request that asks for the same: clients send the same
schema with every request (instructor, LangChain, pydantic-ai), often many at
once, and the last ``CACHED`` are kept by model and grammar fields; requests
that ask for one being compiled wait for that compile (``_shared``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from app.serve.errors import APIError
from app.serve.schemas import ChatCompletionRequest
from app.serve.state import ModelInfo
from mlxcore import Grammar, compile_matcher

log = logging.getLogger("mlxchat.serve")

COMPILING = 2  # grammars compiled at once, over every model
COMPILE_SECONDS = 10.0  # a grammar that takes longer (waiting for a thread included) is refused
LOGGED_CHARS = 1_024  # of a refused schema, in the log (once per request)
CACHED = 64  # compiled grammars kept (each holds its first mask: a vocabulary's bits)
GRAMMAR_FIELDS = {"response_format", "tools", "tool_choice", "parallel_tool_calls"}  # all a grammar is built from
_threads = ThreadPoolExecutor(max_workers=COMPILING, thread_name_prefix="grammar")
_compiles: OrderedDict[tuple, asyncio.Future] = OrderedDict()  # (model, fields) -> its compile, done or not


async def request_grammar(body: ChatCompletionRequest, model: ModelInfo) -> Grammar | None:
    """``body``'s grammar compiled for ``model``'s tokenizer; None when the reply is free; 400 when refused."""
    if not body.constrained:
        return None
    try:  # shielded: a request that stops waiting leaves the compile to those that wait for it too
        return await asyncio.wait_for(asyncio.shield(_shared(body, model)), COMPILE_SECONDS)
    except TimeoutError:
        raise refused(body, f"The grammar for this request took more than {COMPILE_SECONDS:g} s to compile: "
                            "simplify the schema.") from None
    except ValueError as error:
        raise refused(body, str(error)) from None


def _shared(body: ChatCompletionRequest, model: ModelInfo) -> asyncio.Future:
    """The compile of ``body``'s grammar for ``model``: the one under way or done, else a new one (the least
    recently used goes beyond ``CACHED``). A failed compile fails the same way again: it is kept too."""
    key = (model.id, id(model.tokenizer), body.model_dump_json(include=GRAMMAR_FIELDS))
    if key in _compiles:
        _compiles.move_to_end(key)
        return _compiles[key]
    work = asyncio.get_running_loop().run_in_executor(_threads, _compiled, body, model)
    work.add_done_callback(lambda done: done.cancelled() or done.exception())  # (read: never "never retrieved")
    _compiles[key] = work
    while len(_compiles) > CACHED:
        _compiles.popitem(last=False)
    return work


def _compiled(body: ChatCompletionRequest, model: ModelInfo) -> Grammar | None:
    grammar = body.build_grammar()
    if grammar is None:
        return None
    return replace(grammar, compiled=compile_matcher(grammar, model.tokenizer, model.vocab_size, model.eos_ids))


def refused(body: ChatCompletionRequest, message: str) -> APIError:
    """The 400 for a grammar that cannot be used; the schema it came from logged once, cut."""
    source = json.dumps(body.grammar_source(), default=str)
    log.info("refused a grammar: %s schema: %s", message, source[:LOGGED_CHARS] + ("..." if len(source) >
                                                                                    LOGGED_CHARS else ""))
    param = "tool_choice" if body.forced_call else "response_format"
    return APIError(400, message, param=param, code="invalid_schema")
