"""``Engine.generate``: one reply on the caller's caches, run on the caller's thread by the same scheduler and
runner as every batch (``runner.py``), so every entry point decodes through one loop (docs/engine.md says
how: a prefill chunk a step, progress between them, cancel when the caller stops, ``BatchRunner.abandon``
when a step raises).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcore.batching.handle import raise_failed
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.caches import Caches
from mlxcore.events import Event, FinalEvent
from mlxcore.grammar import Grammar
from mlxcore.params import GenerationParams
from mlxcore.prefill import Progress, hold

if TYPE_CHECKING:  # the engine's generate runs here
    from mlxcore.engine import Engine


def generate(engine: Engine, prompt_ids: Sequence[int], caches: Caches, params: GenerationParams,
             progress: Progress | None = None, grammar: Grammar | None = None,
             use_draft: bool = True) -> Generator[Event, None, None]:
    """``Engine.generate``'s events (see there)."""
    engine.last_stats = None  # set when the reply ends: a refused or stopped prefill leaves None
    prompt = list(prompt_ids)
    engine._check_prompt(prompt)
    mx.reset_peak_memory()
    reused = engine.keep_prefix(caches, prompt)
    batch = LocalBatch(engine, max_running=1, step_tokens=engine.prefill_chunk(params))  # a prompt chunk a step
    batch.runner.max_unread = None  # this caller takes every event after each step
    request = Request(tuple(prompt), params, use_draft=use_draft and (caches.draft is not None or engine.drafts
                                                                 and engine.draft_model is None),
                      keep_caches=True, caches=caches, grammar=grammar)
    handle = batch.submit(request)[0]
    to_read, read = len(prompt) - 1 - reused, 0  # the prompt's tokens to compute (its last one is decoded)
    if progress is not None and to_read > 0:
        progress(0, to_read)
    taken = list(prompt)  # the prompt, then the tokens the caller took
    runner = batch.runner
    stepping = finished = False
    brought = True  # whether the last step brought events
    pending: list[Event] = []  # the last step's events not handed to the caller yet
    failure: BaseException | None = None  # what failed the request, after ``pending``
    try:
        while not finished:
            # never wait for what cannot come (asked after a step that brought nothing)
            if not brought and not runner.busy and not handle.finished.is_set():
                raise RuntimeError("The engine dropped a reply without ending it.")
            stepping = True
            runner.step()
            stepping = False
            pending, failure = handle.take()
            brought = bool(pending)
            while pending:
                event = pending.pop(0)
                finished = isinstance(event, FinalEvent)
                if isinstance(event, FinalEvent):
                    engine.last_stats = event.stats
                else:
                    taken.append(event.token)
                yield event
            if failure is not None:  # raised as it was raised in the engine
                error, failure = failure, None
                raise error from None
            if progress is not None and read < to_read:
                read = min(to_read, (batch.runner.tokens_read(handle.request_id) or 0) - reused)
                progress(read, to_read)
    finally:
        if stepping:
            batch.runner.abandon()
        elif not finished:  # the caller stopped: the caches are made to hold its ids at the next step
            handle.cancel()
            batch.run_until(handle.finished.is_set)
            for cache in (caches.target, caches.draft):  # a round may have emitted more than was taken
                if cache is not None:
                    hold(cache, taken)
            if failure is not None:  # (as ``drain`` raises it)
                raise_failed(failure)
            final = next((e for e in [*pending, *drain(handle)] if isinstance(e, FinalEvent)), None)
            if final is not None and final.stats.generated_tokens:  # (stopped while reading the prompt: None)
                engine.last_stats = replace(final.stats, finish_reason="stopped")

