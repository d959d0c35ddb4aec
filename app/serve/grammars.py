"""A request's grammar, built and compiled for its model once, off the event loop, before it is admitted.

llguidance's work grows with the schema (its limits are checked first, in the
request body: ``mlxcore.check_schema``), and compiling drops the GIL, so it runs
on a pool of ``COMPILING`` threads: the streams and ``/health`` go on meanwhile,
and more schemas at once wait their turn instead of taking every core. A grammar
that cannot be compiled, or that no reply can match, is a 400 naming it, before
the engine sees the request (so it never counts as an engine failure); one
slower than ``COMPILE_SECONDS`` is a 400 too (its thread ends on its own later).
The engine takes the compiled matcher, one copy per reply. A ``max_tokens`` below
the shortest reply the grammar allows is a 400 too (the engine closes a reply
before its cap: ``mlxcore.batching.grammar_close``; it cannot close one that
cannot fit).
"""

from __future__ import annotations

import asyncio
import json
import logging
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
_threads = ThreadPoolExecutor(max_workers=COMPILING, thread_name_prefix="grammar")


async def request_grammar(body: ChatCompletionRequest, model: ModelInfo) -> Grammar | None:
    """``body``'s grammar compiled for ``model``'s tokenizer; None when the reply is free; 400 when refused."""
    if not body.constrained:
        return None
    work = asyncio.get_running_loop().run_in_executor(_threads, _compiled, body, model)
    try:
        return await asyncio.wait_for(work, COMPILE_SECONDS)
    except TimeoutError:
        raise refused(body, f"The grammar for this request took more than {COMPILE_SECONDS:g} s to compile: "
                            "simplify the schema.") from None
    except TooShort as error:
        raise APIError(400, str(error), param="max_tokens", code="invalid_value") from None
    except ValueError as error:
        raise refused(body, str(error)) from None


class TooShort(ValueError):
    """``max_tokens`` is below the shortest reply the grammar allows."""


def _compiled(body: ChatCompletionRequest, model: ModelInfo) -> Grammar | None:
    grammar = body.build_grammar()
    if grammar is None:
        return None
    matcher = compile_matcher(grammar, model.tokenizer, model.vocab_size, model.eos_ids)
    cap = body.reply_cap
    if cap is not None and shortest_reply(grammar.text, model.tokenizer, matcher, cap) is None:
        raise TooShort(f"max_tokens is {cap}, below the shortest reply this {grammar.source} allows (more than "
                       f"{cap} tokens): the reply could not be complete JSON. Raise max_tokens.")
    return replace(grammar, compiled=matcher)


def refused(body: ChatCompletionRequest, message: str) -> APIError:
    """The 400 for a grammar that cannot be used; the schema it came from logged once, cut."""
    source = json.dumps(body.grammar_source(), default=str)
    log.info("refused a grammar: %s schema: %s", message, source[:LOGGED_CHARS] + ("..." if len(source) >
                                                                                    LOGGED_CHARS else ""))
    param = "tool_choice" if body.forced_call else "response_format"
    return APIError(400, message, param=param, code="invalid_schema")
