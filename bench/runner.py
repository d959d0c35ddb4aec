"""Runs the benchmark rows and formats the table."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from bench import batching, grammar, kv_quant, speculative
from bench.tensor_parallel import tp2_row
from bench.blas import blas_speedup
from bench.hybrid_spec import hybrid_spec_vs_plain
from bench.decode import decode_vs_mlx_lm
from bench.paged_decode import paged_decode_vs_standard_long, paged_decode_vs_standard_twin
from bench.pool_memory import pool_peak_vs_held
from bench.twin_decode import GREEDY, QWEN3_SAMPLING, twin_decode_vs_mlx_lm
from bench.twin_prefill import twin_prefill_vs_mlx_lm
from bench import kv_measure
from mlxcore.loading import load_model

T = TypeVar("T")


@dataclass(frozen=True)
class BenchSetup:
    model: str = "mini-target"  # the embedded target: every row runs offline
    draft: str = "mini-draft"
    runs: int = 5  # paired runs per ratio; the median is reported
    smoke: bool = False  # every row at its smallest setting: its code runs in seconds, its figures mean nothing

    def pick(self, full: T, smallest: T) -> T:
        """``full`` in a measuring run, ``smallest`` in a smoke run (the suite's check that the row still runs)."""
        return smallest if self.smoke else full


Row = Callable[[BenchSetup], dict]

# row key -> (what it measures, how to run it)
ROWS: dict[str, tuple[str, Row]] = {
    "decode_vs_mlx_lm": ("plain decode tok/s, mlxchat / mlx_lm.stream_generate",
                         lambda s: decode_vs_mlx_lm(s.model, s.runs, tokens=s.pick(256, 8))),
    "blas_speedup": ("prefill with optimized BLAS / with the bundled reference BLAS",
                     lambda s: blas_speedup(s.model, **s.pick({"repeats": max(3, 2 * s.runs)},
                                                                {"lengths": (16,), "headline": 16, "repeats": 1}))),
    "paged_kv_overhead": ("paged cache bytes / bytes of the 1,000 tokens it holds (block 16)",
                          lambda s: kv_measure.paged_kv_overhead(load_model(s.model).model, s.pick(1000, 64))),
    "paged_branch_memory": ("bytes of 8 branches of a 1,000-token prefix, paged / standard forks",
                            lambda s: kv_measure.branch_memory(load_model(s.model).model,
                                                               *s.pick((1000, 50, 8), (64, 8, 2)))),
    "paged_decode_vs_standard_long": ("decode tok/s at a 3,000-token context, paged / standard (fresh; forked too)",
                                      lambda s: paged_decode_vs_standard_long(s.model, s.runs, s.pick(3000, 64))),
    "paged_decode_vs_standard_twin": ("the same on the 8B twin (float32) at 2,000 tokens",
                                      lambda s: paged_decode_vs_standard_twin(s.runs, s.pick(2000, 64))),
    "pool_peak_vs_held": ("peak KV bytes while a chat grows to 3,000 tokens (target + draft) / bytes the tokens hold",
                          lambda s: pool_peak_vs_held(s.model, s.draft, *s.pick((3000, 100, 200), (96, 16, 16)))),
    "spec_speedup_greedy": ("speculative tok/s / plain tok/s, temperature 0",
                            lambda s: speculative.spec_speedup_greedy(s.model, s.draft, s.runs, s.pick(200, 8))),
    "spec_vs_mlx_lm_greedy": ("speculative tok/s, mlxchat / mlx-lm (its default k=2), temperature 0",
                              lambda s: speculative.spec_vs_mlx_lm_greedy(s.model, s.draft, s.runs,
                                                                          tokens=s.pick(200, 8))),
    "accept_vs_mlx_lm_t06": ("accepted drafts per round at temperature 0.6 (k=4 both), mlxchat / mlx-lm",
                             lambda s: speculative.accept_vs_mlx_lm_t06(
                                 s.model, s.draft, s.pick(max(2, s.runs // 2), 1), tokens=s.pick(200, 8))),
    "sampled_decode_vs_mlx_lm": ("plain decode tok/s on the 0.6B twin at Qwen3's sampling, mlxchat / mlx_lm",
                                 lambda s: twin_decode_vs_mlx_lm(s.runs, QWEN3_SAMPLING, s.pick(256, 4))),
    "greedy_decode_vs_mlx_lm_twin": ("plain greedy decode tok/s on the 0.6B twin, mlxchat / mlx_lm",
                                     lambda s: twin_decode_vs_mlx_lm(s.runs, GREEDY, s.pick(256, 4))),
    "hybrid_decode_vs_mlx_lm": ("plain greedy decode tok/s on the Qwen3.5-9B twin (hybrid layers), mlxchat / mlx_lm",
                                lambda s: twin_decode_vs_mlx_lm(s.runs, GREEDY, s.pick(256, 4), kv="standard",
                                                                  twin="qwen3.5-9b")),
    # ~4 minutes a pair on 2 cores (mlx-lm's side ~3 of them): half the runs, at least 2
    "twin_prefill_vs_mlx_lm": ("prefill seconds of 2,000 tokens on the 8B twin (float32), mlx-lm / mlxchat",
                               lambda s: twin_prefill_vs_mlx_lm(s.pick(max(2, s.runs // 2), 1), s.pick(2000, 32))),
    "hybrid_spec_vs_plain": ("speculative / plain greedy tok/s on the Qwen3.5-9B twin, a draft that agrees (value) "
                             "and one that does not ('disagreeing')",
                             lambda s: hybrid_spec_vs_plain(s.pick(max(2, s.runs // 2), 1), s.pick(128, 4))),
    "spec_worst_case": ("speculative / plain tok/s with an untrained draft",
                        lambda s: speculative.spec_worst_case(s.model, s.draft, s.runs, s.pick(200, 8))),
    "batch8_throughput_vs_single": ("aggregate decode tok/s of 8 streams of 256 tokens / one stream, scheduler",
                                    lambda s: batching.batch8_row(s.model, s.runs, "vs_single", s.pick(256, 8))),
    "batch8_vs_mlx_lm": ("the same 8-stream load, mlxchat's scheduler / mlx-lm's BatchGenerator",
                         lambda s: batching.batch8_row(s.model, s.runs, "vs_mlx_lm", s.pick(256, 8))),
    "join_stall_seconds": ("worst gap of 4 running streams while a 2,000-token prompt joins (goal: 2x median step)",
                           lambda s: batching.join_stall(s.model, s.pick(2000, 64))),
    "prefill_steps_8k": ("steps from an 8,000-token prompt's arrival beside 4 decoding streams to its first token, "
                         "0.6B twin (float32); 3,500 tokens on the model too",
                         lambda s: batching.prefill_steps_8k(s.model, *s.pick((8000, 3500), (64, 64)))),
    "kv8_bytes_ratio": ("bytes of a token's keys and values, 8-bit / float (the pool's own account)",
                        lambda s: kv_quant.bytes_ratio(s.model, 8)),
    "kv4_bytes_ratio": ("the same at 4 bits (measured only: 4 bits is not offered, see kv4_accuracy)",
                        lambda s: kv_quant.bytes_ratio(s.model, 4)),
    "kv8_decode_vs_float_long": ("decode tok/s at a 3,000-token context, 8-bit KV / float KV, paged",
                                 lambda s: kv_quant.decode_vs_float_long(s.model, s.runs, s.pick(3000, 64))),
    "kv8_prefill_peak_vs_float": ("MLX's peak memory prefilling 2,000 tokens, 8-bit KV / float KV",
                                  lambda s: kv_quant.prefill_peak_vs_float(s.model, *s.pick((2000, 2), (64, 1)))),
    "kv8_accuracy": ("mean KL(float || 8-bit) of next-token distributions over 1,000 decoded tokens (+ agreement)",
                     lambda s: kv_quant.accuracy(s.model, 8, *s.pick((1000, 1000), (64, 8)))),
    "kv4_accuracy": ("the same at 4 bits (per token, the layout 8 bits uses)",
                     lambda s: kv_quant.accuracy(s.model, 4, *s.pick((1000, 1000), (64, 8)))),
    "spec_lone_vs_plain": ("a lone stream through the scheduler with the draft / plain decode, temperature 0",
                           lambda s: batching.spec_lone_vs_plain(s.model, s.draft, s.runs, s.pick(200, 8))),
    "grammar_decode_vs_free": ("decode tok/s under a JSON schema / free, 0.6B twin, alone and with a draft (goal >= 0.9)",
                               lambda s: grammar.grammar_decode_vs_free(s.runs, s.pick(128, 8))),
    "grammar_mask_us": ("microseconds to fill one next-token grammar mask, p50 (p99 beside), 0.6B twin",
                        lambda s: grammar.grammar_mask_us(s.pick(256, 16))),
    "grammar_spec_accept": ("draft tokens accepted per round under a JSON schema, draft constrained (and not)",
                            lambda s: grammar.grammar_spec_accept(s.pick(64, 8))),
    "tp2_decode_vs_single": ("plain decode tok/s on 2 ring ranks of one 2-core box / 1 process: the cost of "
                             "splitting, not a speedup (and on the 0.6B twin)",
                             lambda s: tp2_row(s.model, s.runs, *s.pick((128, 48), (8, 4)))),
}


RAISE_ENV = "MLXCHAT_BENCH_RAISE"  # rows named here (comma-separated) raise: the tests' failing row


def run_rows(names: list[str], setup: BenchSetup, on_row: Callable[[str, dict], None] | None = None,
             rows: dict[str, tuple[str, Row]] = ROWS) -> dict[str, dict]:
    """Run the named rows in order; returns {name: result}, a failed row's result {"error": one line}.

    A row that raises never stops the others; ``on_row`` sees each result as soon as its row ends.
    ``rows`` lets higher layers (sessions, the TUI, the server) add their own rows to mlxcore's.
    """
    unknown = [n for n in names if n not in rows]
    if unknown:
        raise ValueError(f"unknown bench row(s) {', '.join(unknown)}; rows: {', '.join(rows)}")
    results = {}
    for name in names:
        start = time.perf_counter()
        try:
            if name in os.environ.get(RAISE_ENV, "").split(","):
                raise RuntimeError(f"made to raise by {RAISE_ENV}")
            result = rows[name][1](setup)
        except Exception as error:  # one row's failure is its result, the run goes on
            result = {"value": None, "error": _one_line(error)}
        results[name] = result | {"row_seconds": round(time.perf_counter() - start, 1)}
        if on_row:
            on_row(name, results[name])
    return results


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or "(no message)"
    return f"{type(error).__name__}: {text}"


def format_row(name: str, what: str, result: dict) -> str:
    value = result.get("value")
    shown = "n/a" if value is None else f"{value:8.3f}"
    if "error" in result:
        return f"{name:<24} {'FAILED':>8}   {what}\n{'':<35}{result['error']}"
    detail = ", ".join(f"{k}={_short(v)}" for k, v in result.items() if k not in ("value", "ratios", "key"))
    return f"{name:<24} {shown:>8}   {what}\n{'':<35}({detail})"


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)
