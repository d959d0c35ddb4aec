"""Rows of the continuous-batching scheduler, on the load of ``batch_load`` (the same as mlx-lm's side).

Our streams run through ``LocalBatch`` on this thread; a token's time is the
wall clock when the step that made it returned, as mlx-lm's side stamps the
return of ``BatchGenerator.next()``. Rates, the join figures and their windows
are computed by the same functions (``mlx_lm_batch.decode_rate``, ``stall_figures``).
Every stream is greedy and none ends early (no end-of-sequence ids).

- ``batch8_throughput_vs_single``: 8 streams of 256 tokens, aggregate decode
  tok/s / one stream alone through the scheduler (no draft).
- ``batch8_vs_mlx_lm``: the same 8-stream load, ours / mlx-lm's ``BatchGenerator``.
- ``join_stall_seconds``: the worst gap of 4 running streams while a 2,000-token
  prompt joins (value), against twice their median step (the goal) and mlx-lm's.
- ``prefill_steps_8k``: the steps (and seconds) from an 8,000-token prompt's arrival
  beside 4 decoding streams to its first token, on the float32 0.6B twin; the
  same for a 3,500-token prompt on the given model; with the device profile's chunks.
- ``spec_lone_vs_plain``: a lone stream through the scheduler with the draft /
  plain ``Engine.generate``; ``spec_speedup_greedy``'s measure beside it.
Ratios are medians of runs that alternate the two sides.
"""

from __future__ import annotations

import statistics
import time
from functools import lru_cache

from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from bench import mlx_lm_batch, speculative
from bench.batch_load import (JOIN_PROMPT_TOKENS, JOIN_RUNNING, JOIN_RUNNING_TOKENS, REPLY_TOKENS, STREAMS,
                              batch_prompts, long_prompt, stream_prompt)
from bench.mlx_lm_batch import JOIN_AFTER, JOIN_WATCH_STEPS, StreamTrace, decode_rate, stall_figures
from bench.timing import paired_median
from mlxcore.device_profile import current
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from bench.twins import twin_folder


def _engine(model_ref: str, draft_ref: str | None = None) -> Engine:
    loaded = load_model(model_ref)
    draft = load_model(draft_ref).model if draft_ref else None
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"), draft_model=draft)
    engine.eos_ids = set()  # every stream has its full length
    engine.warm_up()
    return engine


def decode_streams(engine: Engine, prompts: list[list[int]], tokens: int) -> list[StreamTrace]:
    """Every prompt submitted at once; steps run until each stream has ``tokens`` tokens."""
    batch = LocalBatch(engine, max_running=max(len(prompts), 1))
    handles = [batch.submit(Request(tuple(p), GenerationParams(max_tokens=tokens)))[0] for p in prompts]
    traces = [StreamTrace() for _ in prompts]
    while batch.busy:
        batch.step()
        _collect(handles, traces, time.perf_counter())
    return traces


def _collect(handles, traces: list[StreamTrace], now: float) -> None:
    for handle, trace in zip(handles, traces):
        for event in drain(handle):
            if isinstance(event, TokenEvent):
                trace.add(event.token, now)


def batch8_row(model_ref: str, runs: int, key: str, tokens: int = REPLY_TOKENS) -> dict:
    """One of the two 8-stream rows: the shared runs' ``key`` ratio as the value (the runs are made once)."""
    result = batch8_throughput(model_ref, runs, tokens)
    return {"value": result[key], **{k: v for k, v in result.items() if k != key}}


@lru_cache(maxsize=2)
def batch8_throughput(model_ref: str, runs: int, tokens: int = REPLY_TOKENS) -> dict:
    """``batch8_throughput_vs_single`` and ``batch8_vs_mlx_lm`` from one set of alternating runs."""
    engine = _engine(model_ref)
    model = engine.model
    prompts = batch_prompts(model.args.vocab_size, STREAMS)
    decode_streams(engine, prompts, tokens)  # warm-up: every batch size's kernels
    mlx_lm_batch.decode_batch(model, prompts, tokens)
    ours8, ours1, theirs8 = [], [], []
    for _ in range(runs):
        ours8.append(decode_rate(decode_streams(engine, prompts, tokens))["tokens_per_second"])
        ours1.append(decode_rate(decode_streams(engine, prompts[:1], tokens))["tokens_per_second"])
        theirs8.append(decode_rate(mlx_lm_batch.decode_batch(model, prompts, tokens))["tokens_per_second"])
    return {"vs_single": statistics.median(a / b for a, b in zip(ours8, ours1)),
            "vs_mlx_lm": statistics.median(a / b for a, b in zip(ours8, theirs8)),
            "ours8_tps": statistics.median(ours8), "ours1_tps": statistics.median(ours1),
            "mlx_lm8_tps": statistics.median(theirs8), "streams": STREAMS, "tokens": tokens}


def join_run(engine: Engine, prompt_tokens: int = JOIN_PROMPT_TOKENS,
             joining: list[int] | None = None) -> tuple[list[StreamTrace], float]:
    """4 streams decode; when each has ``JOIN_AFTER`` tokens the long prompt (or ``joining``) joins; run until
    it has 1 + ``JOIN_WATCH_STEPS`` tokens. (traces: the running ones', then the joined one's; time it joined)."""
    vocab = engine.model.args.vocab_size
    batch = LocalBatch(engine, max_running=JOIN_RUNNING + 1)
    params = GenerationParams(max_tokens=JOIN_RUNNING_TOKENS)
    handles = [batch.submit(Request(tuple(p), params))[0] for p in batch_prompts(vocab, JOIN_RUNNING)]
    traces = [StreamTrace() for _ in handles]

    def run_until(done) -> None:
        while not done():
            batch.step()
            _collect(handles, traces, time.perf_counter())

    run_until(lambda: all(len(t.tokens) >= JOIN_AFTER for t in traces))
    joined_at = time.perf_counter()
    handles.append(batch.submit(Request(tuple(joining or long_prompt(vocab, prompt_tokens)),
                                        GenerationParams(max_tokens=1 + JOIN_WATCH_STEPS)))[0])
    traces.append(StreamTrace())
    run_until(lambda: len(traces[-1].tokens) == 1 + JOIN_WATCH_STEPS)
    for handle in handles[:-1]:
        handle.cancel()
    batch.run_until(lambda: False)
    return traces, joined_at


def join_stall(model_ref: str, prompt_tokens: int = JOIN_PROMPT_TOKENS) -> dict:
    """``join_stall_seconds``: ours, then mlx-lm's on the same load, each after an untimed run. Ours warms up
    with another 2,000-token prompt, so the measured one is not in the pool's cache: it is read in full, as
    mlx-lm reads it (the running streams' prompts are, as they are on mlx-lm's side after its warm-up).

    Beside them, what the figures are made of (docs/decisions.md, "What a join can reach"): the same streams
    decoding as many steps with nobody joining (``quiet``), so the reading's own cost shows at the same context
    lengths; and the first token of a prompt as long read with nothing else running."""
    engine = _engine(model_ref)
    vocab = engine.model.args.vocab_size
    join_run(engine, joining=stream_prompt(vocab, 98, prompt_tokens))
    traces, joined_at = join_run(engine, prompt_tokens)
    ours = stall_figures(traces[:-1], traces[-1], joined_at)
    quiet = decode_streams(engine, batch_prompts(vocab, JOIN_RUNNING), JOIN_AFTER + max(ours["gaps_after_join"]))
    alone = join_steps(engine, stream_prompt(vocab, 97, prompt_tokens), running=0)["seconds"]
    theirs = mlx_lm_batch.measure_join(engine.model, prompt_tokens).figures
    return {"value": ours["worst_gap_seconds"], "goal_seconds": 2 * ours["median_step_seconds"],
            "ratio": ours["ratio"], "p99_ratio": ours["p99_ratio"], "median_step_seconds": ours["median_step_seconds"],
            "join_ttft_seconds": ours["join_ttft_seconds"], "after_join_step_ratio": ours["after_join_step_ratio"],
            **_reading(traces[:-1], traces[-1].times[0], joined_at, quiet, ours["median_step_seconds"]),
            "read_alone_seconds": alone,
            "mlx_lm_worst_gap_seconds": theirs["worst_gap_seconds"], "mlx_lm_ratio": theirs["ratio"],
            "mlx_lm_p99_ratio": theirs["p99_ratio"], "mlx_lm_after_join_step_ratio": theirs["after_join_step_ratio"],
            "mlx_lm_join_ttft_seconds": theirs["join_ttft_seconds"]}


def _reading(running: list[StreamTrace], first: float, joined_at: float, quiet: list[StreamTrace],
             median_step: float) -> dict:
    """The running streams' gaps while the prompt is read (insertion to its first token) against the same
    streams' gaps at the same tokens with nobody joining: ``reading_p99_vs_quiet`` (99th percentile / the
    quiet median), ``reading_seconds`` (what the reading added to a stream's time, the mean over streams),
    ``no_join_worst_ratio`` (this machine's own worst quiet gap there, against the median step before). The quiet
    run comes after the join's, not interleaved with it: where the host's speed drifts, ``reading_seconds`` does."""
    joined, alone, added = [], [], []
    for trace, control in zip(running, quiet):
        window = [k for k, (at, _) in enumerate(trace.gaps()) if joined_at < at <= first]
        quiet_gaps = control.gaps()
        joined += [trace.gaps()[k][1] for k in window]
        alone += [quiet_gaps[k][1] for k in window]
        added.append(sum(trace.gaps()[k][1] - quiet_gaps[k][1] for k in window))
    return {"reading_p99_vs_quiet": mlx_lm_batch.percentile(sorted(joined), 0.99) / statistics.median(alone),
            "reading_seconds": statistics.mean(added), "no_join_worst_ratio": max(alone) / median_step}


def join_steps(engine: Engine, prompt: list[int], progress=None, running: int = JOIN_RUNNING) -> dict:
    """Steps and seconds from ``prompt``'s arrival beside ``running`` decoding streams to its first token;
    ``progress(batch, steps, seconds)`` is called after every step while it joins (``studies/join_progress.py``)."""
    vocab = engine.model.args.vocab_size
    batch = LocalBatch(engine, max_running=running + 1)
    params = GenerationParams(max_tokens=JOIN_RUNNING_TOKENS)
    streams = [batch.submit(Request(tuple(p), params))[0] for p in batch_prompts(vocab, running)]
    made = [0] * running
    while streams and min(made) < JOIN_AFTER:
        batch.step()
        made = [count + sum(isinstance(e, TokenEvent) for e in drain(h)) for count, h in zip(made, streams)]
    start = time.perf_counter()
    joined = batch.submit(Request(tuple(prompt), GenerationParams(max_tokens=1)))[0]
    steps = 0
    while not any(isinstance(e, TokenEvent) for e in drain(joined)):
        batch.step()
        steps += 1
        for handle in streams:  # read, as a client does: an unread stream would be paused
            list(drain(handle))
        if progress is not None:
            progress(batch, steps, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    for handle in streams:
        handle.cancel()
    batch.run_until(lambda: False)
    return {"steps": steps, "seconds": seconds, "prompt_tokens": len(prompt)}


def prefill_steps_8k(model_ref: str, twin_tokens: int = 8000, model_tokens: int = 3500) -> dict:
    """``prefill_steps_8k``: ``join_steps`` of 8,000 tokens on the float32 0.6B twin (its value: the steps),
    and of 3,500 tokens on ``model_ref``; each after an untimed join of another prompt of that length."""
    figures = {"profile": current().kind, "step_tokens": current().step_tokens}
    for name, ref, tokens in (("twin", str(twin_folder("qwen3-0.6b", bits=None)), twin_tokens),
                              ("model", model_ref, model_tokens)):
        engine = _engine(ref)
        vocab = engine.model.args.vocab_size
        join_steps(engine, stream_prompt(vocab, 98, tokens // 4))  # warm-up (compiles), no prefix of the next
        measured = join_steps(engine, long_prompt(vocab, tokens))
        figures.update({f"{name}_{key}": value for key, value in measured.items()})
    return {"value": figures["twin_steps"], **figures}


def spec_lone_vs_plain(model_ref: str, draft_ref: str, runs: int, tokens: int = speculative.MAX_TOKENS) -> dict:
    """A lone greedy reply through the scheduler with the draft / ``Engine.generate`` plain, on
    ``spec_speedup_greedy``'s chat prompts and measure (paired runs); that row's own ratio beside it."""
    target, draft, prompts = speculative._pair(model_ref, draft_ref)
    kv, params = KVConfig(kind="paged"), GenerationParams(max_tokens=tokens)
    spec = Engine(target.model, target.tokenizer, kv=kv, draft_model=draft.model)
    plain = Engine(target.model, target.tokenizer, kv=kv)

    def scheduled(ids):
        batch = LocalBatch(spec)
        handle = batch.submit(Request(tuple(ids), params))[0]
        while batch.busy:
            batch.step()
            yield from (e for e in drain(handle) if isinstance(e, TokenEvent))

    ours, base = scheduled, speculative._ours(plain, params)
    engine_spec = speculative._ours(spec, params)
    for run_one in (ours, base, engine_spec):  # warm up, learn k
        speculative._rate_over_prompts(run_one, prompts[:2])
    rate = speculative._rate_over_prompts
    r = paired_median(lambda: rate(ours, prompts), lambda: rate(base, prompts), runs)
    e = paired_median(lambda: rate(engine_spec, prompts), lambda: rate(base, prompts), runs)
    return {"value": r["ratio"], "spec_speedup_greedy": e["ratio"], "scheduler_spec_tps": r["ours"],
            "plain_tps": r["theirs"], "engine_spec_tps": e["ours"], "ratios": r["ratios"]}
