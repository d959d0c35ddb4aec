"""mlx-lm's side of the batching rows: exact token counts, and a batch's greedy tokens equal to each prompt run alone.

The reference is mlx-lm's own single-sequence loop, ``generate_step`` (what
``generate`` and ``stream_generate`` run), on the same tiny random model.
"""

from __future__ import annotations

import copy
from functools import cache

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tiny_models import tiny_qwen3

from assets import MODELS_DIR
from bench.batch_load import (JOIN_PROMPT_TOKENS, JOIN_RUNNING, STREAMS, batch_prompts, long_prompt,
                                      stream_prompt)
from bench.mlx_lm_batch import JOIN_AFTER, JOIN_WATCH_STEPS, measure_join, measure_single, measure_throughput

VOCAB = 2048  # the embedded tokenizer's


@cache
def model():
    return tiny_qwen3(0, vocab_size=VOCAB)


def alone(prompt: list[int], tokens: int) -> list[int]:
    """Greedy ids of ``prompt`` run by itself through mlx-lm's generate_step (no end-of-sequence check there)."""
    return [token for token, _ in generate_step(mx.array(prompt), model(), max_tokens=tokens)]


def test_prompts_follow_the_formula_with_their_own_lengths():
    prompts = batch_prompts(VOCAB)
    assert [len(p) for p in prompts] == [32 + 16 * s for s in range(STREAMS)]
    assert prompts[3][5] == (5 * 7919 + 3 * 131) % (VOCAB - 1) + 1
    assert all(1 <= t < VOCAB for p in prompts for t in p)
    assert long_prompt(VOCAB) == stream_prompt(VOCAB, 99, JOIN_PROMPT_TOKENS)
    assert len(long_prompt(VOCAB)) == JOIN_PROMPT_TOKENS


def test_batch_of_eight_gives_each_stream_its_tokens_alone():
    tokens = 12
    result = measure_throughput(model(), STREAMS, tokens)
    prompts = batch_prompts(VOCAB, STREAMS)
    for s, trace in enumerate(result.traces):
        assert trace.tokens == alone(prompts[s], tokens), f"stream {s} differs from its prompt run alone"
    figures = result.figures
    assert (figures["streams"], figures["tokens"]) == (STREAMS, tokens)
    # Every first token came in one call, so the window counts all the others.
    counted = figures["tokens_per_second"] * figures["seconds"]
    assert round(counted) == STREAMS * (tokens - 1)


def test_single_stream_runs_past_end_of_sequence_in_both_paths():
    tokens = 16
    expected = alone(batch_prompts(VOCAB, 1)[0], tokens)
    tokenizer = copy.copy(load_tokenizer(MODELS_DIR / "mini-target"))
    tokenizer.eos_token_ids = {expected[0], expected[-1]}  # would end either path early if it were honoured
    result = measure_single(model(), tokenizer, tokens)
    batch, reference = result.traces
    assert batch.tokens == expected
    assert reference.tokens == expected
    assert tokenizer.eos_token_ids == {expected[0], expected[-1]}  # the caller's tokenizer is left alone
    assert result.figures["tokens_per_second"] > 0 and result.figures["stream_generate_tokens_per_second"] > 0


def test_join_sees_the_joined_tokens_and_gaps_of_every_running_stream():
    result = measure_join(model(), prompt_tokens=JOIN_PROMPT_TOKENS)
    *running, joined = result.traces
    figures = result.figures
    assert len(running) == JOIN_RUNNING
    assert joined.tokens == alone(long_prompt(VOCAB), 1 + JOIN_WATCH_STEPS)
    prompts = batch_prompts(VOCAB, JOIN_RUNNING)
    for s, trace in enumerate(running):
        assert trace.tokens == alone(prompts[s], len(trace.tokens)), f"running stream {s} differs"
        # A token at every step of the window: at least one per joined token.
        assert figures["gaps_after_join"][s] >= 1 + JOIN_WATCH_STEPS
        assert len(trace.tokens) == JOIN_AFTER + figures["gaps_after_join"][s]
    assert figures["joined_tokens"] == 1 + JOIN_WATCH_STEPS
    assert figures["worst_gap_seconds"] >= figures["median_step_seconds"] > 0
    assert figures["ratio"] == figures["worst_gap_seconds"] / figures["median_step_seconds"]
    assert figures["join_ttft_seconds"] > 0
