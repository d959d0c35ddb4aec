"""mlx-lm's side of the continuous-batching rows: its ``BatchGenerator`` on the load of batch_load.

Every stream is greedy and generates exactly its token count: the generator is
given no stop tokens, so only ``max_tokens`` ends a stream. A token's time is
the wall clock when ``BatchGenerator.next()`` returned it, which is when a
server (mlx_lm.server does this) can hand it to its client. The generator
pipelines: the call that returns token n has also started computing token n+1,
and a prompt it prefills in a call delays the tokens that call returns.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.nn as nn
from mlx_lm import stream_generate
from mlx_lm.generate import BatchGenerator
from mlx_lm.tokenizer_utils import TokenizerWrapper

from bench.batch_load import (JOIN_PROMPT_TOKENS, JOIN_RUNNING, JOIN_RUNNING_TOKENS, REPLY_TOKENS, STREAMS,
                              batch_prompts, long_prompt)
from mlxcore.loading import load_model

JOIN_AFTER = 32  # tokens each running stream has produced when the long prompt joins
JOIN_WATCH_STEPS = 32  # tokens of the joined stream, after its first, that the stall window lasts


@dataclass
class StreamTrace:
    """One stream's generated ids and the wall clock (perf_counter) at which each was handed over."""

    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def add(self, token: int, at: float) -> None:
        self.tokens.append(token)
        self.times.append(at)

    def gaps(self) -> list[tuple[float, float]]:
        """(end time, seconds since the stream's previous token) for every token after the first."""
        return [(b, b - a) for a, b in zip(self.times, self.times[1:])]


@dataclass(frozen=True)
class Measured:
    """A row's figures, and the traces they were computed from (the tests check those)."""

    figures: dict
    traces: list[StreamTrace]


def mlx_lm_batch_throughput(model_ref: str, streams: int = STREAMS, tokens: int = REPLY_TOKENS) -> dict:
    """Aggregate decode tokens/s of ``streams`` prompts of ``batch_prompts`` submitted at once.

    Timed: from ``start``, the return of the ``next()`` call that handed over the
    last stream's first token, to the return of the call that handed over the
    last token of all; counted: the tokens handed over by calls after ``start``
    (``streams * (tokens - 1)`` when all first tokens come in one call, as here).
    Returns ``{"tokens_per_second", "streams", "tokens", "seconds"}``.
    """
    return measure_throughput(load_model(model_ref).model, streams, tokens).figures


def mlx_lm_single_stream(model_ref: str, tokens: int = REPLY_TOKENS) -> dict:
    """The throughput measure on one stream (the first prompt), through BatchGenerator and stream_generate.

    ``stream_generate`` is timed the same way: (tokens - 1) / seconds from its
    first token to its last. Returns ``{"tokens_per_second",
    "stream_generate_tokens_per_second", "tokens", "seconds"}``.
    """
    loaded = load_model(model_ref)
    return measure_single(loaded.model, loaded.tokenizer, tokens).figures


def measure_throughput(model: nn.Module, streams: int = STREAMS, tokens: int = REPLY_TOKENS) -> Measured:
    """``mlx_lm_batch_throughput`` on a loaded model, after one untimed run of the same load."""
    prompts = batch_prompts(vocab_size(model), streams)
    decode_batch(model, prompts, tokens)  # warm-up: compiles, allocates the caches' sizes
    traces = decode_batch(model, prompts, tokens)
    return Measured({**decode_rate(traces), "streams": streams, "tokens": tokens}, traces)


def measure_single(model: nn.Module, tokenizer: TokenizerWrapper, tokens: int = REPLY_TOKENS) -> Measured:
    """``mlx_lm_single_stream`` on a loaded model; traces: [BatchGenerator's, stream_generate's]."""
    prompt = batch_prompts(vocab_size(model), 1)[0]
    no_eos = copy.copy(tokenizer)
    no_eos.eos_token_ids = set()  # stream_generate stops on these; the copy leaves the caller's as they were

    def reference() -> StreamTrace:
        return trace_stream(r.token for r in stream_generate(model, no_eos, prompt, max_tokens=tokens))

    decode_batch(model, [prompt], tokens)  # warm-up of both paths
    reference()
    ours, theirs = decode_batch(model, [prompt], tokens)[0], reference()
    figures = {**decode_rate([ours]), "tokens": tokens,
               "stream_generate_tokens_per_second": decode_rate([theirs])["tokens_per_second"]}
    return Measured(figures, [ours, theirs])


def measure_join(model: nn.Module, prompt_tokens: int = JOIN_PROMPT_TOKENS) -> Measured:
    """``JOIN_RUNNING`` streams decode; when each has ``JOIN_AFTER`` tokens the long prompt is inserted.

    Running gaps are read from the insertion to the joined stream's token
    1 + ``JOIN_WATCH_STEPS``; the median step is the running gaps before it.
    Run twice, the first untimed. Traces: the running streams', then the joined one's.
    """
    join_run(model, prompt_tokens)  # warm-up: the long prefill's shapes and sizes too
    traces, joined_at = join_run(model, prompt_tokens)
    return Measured(stall_figures(traces[:-1], traces[-1], joined_at), traces)


def join_run(model: nn.Module, prompt_tokens: int) -> tuple[list[StreamTrace], float]:
    """The join scenario once: (traces, the running ones' then the joined one's; time of the insertion)."""
    vocab = vocab_size(model)
    generator = greedy_generator(model)
    running = generator.insert(batch_prompts(vocab, JOIN_RUNNING), [JOIN_RUNNING_TOKENS] * JOIN_RUNNING)
    traces = {uid: StreamTrace() for uid in running}
    drive(generator, traces, lambda: all(len(traces[u].tokens) >= JOIN_AFTER for u in running))
    joined_at = time.perf_counter()
    (joined,) = generator.insert([long_prompt(vocab, prompt_tokens)], [1 + JOIN_WATCH_STEPS])
    traces[joined] = StreamTrace()
    drive(generator, traces, lambda: len(traces[joined].tokens) == 1 + JOIN_WATCH_STEPS)
    generator.close()
    return [traces[u] for u in running] + [traces[joined]], joined_at


def stall_figures(running: list[StreamTrace], joined: StreamTrace, joined_at: float) -> dict:
    """Worst running gap in (insertion, joined's last watched token] against the median gap before it.

    ``after_join_step_ratio``: the running gaps' median once the joined stream decodes too (after its first
    token), against the same median before: what the batch's new rows and longer context cost a step, which
    no way of reading the prompt changes (a floor under the window's 99th percentile)."""
    first, end = joined.times[0], joined.times[-1]
    before = [gap for t in running for at, gap in t.gaps() if at <= joined_at]
    during = [[gap for at, gap in t.gaps() if joined_at < at <= end] for t in running]
    settled = [gap for t in running for at, gap in t.gaps() if first < at <= end]
    if not before or not all(during) or not settled:
        raise RuntimeError("every running stream needs gaps before the join and after it")
    worst, median = max(max(g) for g in during), statistics.median(before)
    gaps = sorted(gap for g in during for gap in g)
    return {"worst_gap_seconds": worst, "median_step_seconds": median, "ratio": worst / median,
            "p99_ratio": percentile(gaps, 0.99) / median,
            "after_join_step_ratio": statistics.median(settled) / median,
            "join_ttft_seconds": first - joined_at, "joined_tokens": len(joined.tokens),
            "gaps_after_join": [len(g) for g in during]}


def percentile(ordered: list[float], share: float) -> float:
    """The value ``share`` of the way up ``ordered`` (sorted), by rank."""
    return ordered[int(share * (len(ordered) - 1))]


def decode_batch(model: nn.Module, prompts: list[list[int]], tokens: int) -> list[StreamTrace]:
    """Every prompt inserted at once into one greedy BatchGenerator, run until each has ``tokens`` tokens."""
    generator = greedy_generator(model)
    uids = generator.insert(prompts, [tokens] * len(prompts))
    traces = {uid: StreamTrace() for uid in uids}
    drive(generator, traces, lambda: all(len(t.tokens) == tokens for t in traces.values()))
    generator.close()
    return [traces[uid] for uid in uids]


def decode_rate(traces: list[StreamTrace]) -> dict:
    """Tokens handed over after every stream had its first, per second from then to the very last token."""
    start = max(t.times[0] for t in traces)
    seconds = max(t.times[-1] for t in traces) - start
    count = sum(at > start for t in traces for at in t.times)
    if count == 0 or seconds <= 0:
        raise RuntimeError("a decode rate needs tokens after every stream's first")
    return {"tokens_per_second": count / seconds, "seconds": seconds}


def greedy_generator(model: nn.Module) -> BatchGenerator:
    """mlx-lm's BatchGenerator with its defaults (argmax sampler, prefill step 2048, as mlx_lm.server's).

    ``stop_tokens=[]`` makes end-of-sequence impossible: a stream ends only at its max_tokens.
    """
    return BatchGenerator(model, stop_tokens=[])


def drive(generator: BatchGenerator, traces: dict[int, StreamTrace], until: Callable[[], bool]) -> None:
    """Call ``generator.next()`` until ``until()``, stamping each token with the time the call returned."""
    while not until():
        prompt_responses, responses = generator.next()
        now = time.perf_counter()
        if not prompt_responses and not responses:
            raise RuntimeError("BatchGenerator has nothing left to do but the streams are not done")
        for r in responses:
            traces[r.uid].add(r.token, now)


def trace_stream(tokens: Iterable[int]) -> StreamTrace:
    """A trace of a token iterator, each token stamped when the iterator yielded it."""
    trace = StreamTrace()
    for token in tokens:
        trace.add(token, time.perf_counter())
    return trace


def vocab_size(model: nn.Module) -> int:
    """The model's config vocab_size: the one batch_prompts is given on both sides."""
    return model.args.vocab_size
