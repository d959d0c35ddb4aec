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
that ask for one being compiled wait for that compile (``_shared``). A
``max_tokens`` below the shortest reply the grammar allows is a 400 too (the
engine closes a reply before its cap: ``mlxcore.batching.grammar_close``; it
cannot close one that cannot fit), checked for each request (``_fits``).
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
from mlxcore import Grammar, compile_matcher, shortest_reply

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
        grammar = await asyncio.wait_for(asyncio.shield(_shared(body, model)), COMPILE_SECONDS)
        if grammar is not None and body.reply_cap is not None:  # (the shortest reply is measured once a grammar)
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(_threads, _fits, grammar, model,
                                                                              body.reply_cap), COMPILE_SECONDS)
        return grammar
    except TimeoutError:
        raise refused(body, f"The grammar for this request took more than {COMPILE_SECONDS:g} s to compile: "
                            "simplify the schema.") from None
    except TooShort as error:
        raise APIError(400, str(error), param="max_tokens", code="invalid_value") from None
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


class TooShort(ValueError):
    """``max_tokens`` is below the shortest reply the grammar allows."""


def _compiled(body: ChatCompletionRequest, model: ModelInfo) -> Grammar | None:
    grammar = body.build_grammar()
    if grammar is None:
        return None
    matcher = compile_matcher(grammar, model.tokenizer, model.vocab_size, model.eos_ids)
    return replace(grammar, compiled=matcher)


def _fits(grammar: Grammar, model: ModelInfo, cap: int) -> None:
    """``TooShort`` when no reply the grammar allows fits in ``cap`` tokens."""
    assert grammar.compiled is not None  # (``_compiled``)
    if shortest_reply(grammar.text, model.tokenizer, grammar.compiled, cap) is None:
        raise TooShort(f"max_tokens is {cap}, below the shortest reply this {grammar.source} allows (more than "
                       f"{cap} tokens): the reply could not be complete JSON. Raise max_tokens.")


def refused(body: ChatCompletionRequest, message: str) -> APIError:
    """The 400 for a grammar that cannot be used; the schema it came from logged once, cut."""
    source = json.dumps(body.grammar_source(), default=str)
    log.info("refused a grammar: %s schema: %s", message, source[:LOGGED_CHARS] + ("..." if len(source) >
                                                                                    LOGGED_CHARS else ""))
    param = "tool_choice" if body.forced_call else "response_format"
    return APIError(400, message, param=param, code="invalid_schema")
