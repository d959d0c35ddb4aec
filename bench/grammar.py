"""Rows `grammar_decode_vs_free`, `grammar_mask_us` and `grammar_spec_accept`: constrained decoding on the 0.6B twin.

The twin (float32, Qwen3's 151,936-token vocabulary) writes noise when free; under
``SCHEMA`` (a long array of small objects with enums, bounded numbers, patterned
and bounded strings) it writes JSON that never ends within the token count, so
both sides decode exactly ``tokens`` tokens. The draft is the twin's own 4-bit
copy (same seed): it agrees with the target often, as a real draft does, and
drafts a fixed k so that both sides take the same rounds.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from unittest import mock

from mlxcore import decode_speculative
from mlxcore.batching.constraints import Constraint
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from bench.decode import PROMPT
from bench.timing import paired_median, stream_rate
from mlxcore.chat_template import render_chat
from bench.draft_lengths import FixedDraftLength
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.grammar import Grammar, json_schema
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from bench.twins import twin_folder

TWIN = "qwen3-0.6b"
DRAFT_K = 3
ITEM = {"type": "object", "additionalProperties": False, "required": ["id", "kind", "code", "note", "ok"],
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99999},
                       "kind": {"enum": ["alpha", "beta", "gamma", "delta"]},
                       "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                       "note": {"type": "string", "maxLength": 24}, "ok": {"type": "boolean"}}}
SCHEMA = {"type": "array", "items": ITEM, "minItems": 200, "maxItems": 200}


def _engine(draft: bool) -> tuple[Engine, list[int]]:
    loaded = load_model(str(twin_folder(TWIN, bits=None)))
    drafter = load_model(str(twin_folder(TWIN, bits=4))).model if draft else None
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"), draft_model=drafter)
    engine.warm_up()
    engine.eos_ids = set()  # both sides run to exactly `tokens` tokens
    engine.draft_control = FixedDraftLength(DRAFT_K)
    ids = render_chat(loaded.tokenizer, [{"role": "user", "content": PROMPT}], enable_thinking=False)
    return engine, ids


def _run(engine: Engine, ids: list[int], params: GenerationParams, grammar: Grammar | None, draft: bool,
         constrain_draft: bool = True) -> tuple[float, FinalEvent]:
    """(decode tok/s, the final event) of one reply through the scheduler, alone (``constrain_draft`` False:
    the draft proposes freely, the target's masks alone keep the reply in the grammar)."""
    batch = LocalBatch(engine, max_running=1)
    handle = batch.submit(Request(tuple(ids), params, use_draft=draft, grammar=grammar))[0]
    final: list[FinalEvent] = []

    def events():
        while batch.busy:
            batch.step()
            for event in drain(handle):
                if isinstance(event, FinalEvent):
                    final.append(event)
                yield event
    with mock.patch.object(decode_speculative, "CONSTRAIN_DRAFT", constrain_draft):
        rate = stream_rate(events(), lambda e: isinstance(e, TokenEvent))[0]
    return rate, final[0]


def grammar_decode_vs_free(runs: int, tokens: int = 128) -> dict:
    """Decode tok/s under ``SCHEMA`` / free, greedy, target alone and with its draft (k fixed)."""
    grammar, params = json_schema(SCHEMA), GenerationParams(max_tokens=tokens)
    result = {}
    for draft in (False, True):
        engine, ids = _engine(draft)
        constrained = lambda engine=engine, ids=ids, draft=draft: _run(engine, ids, params, grammar, draft)[0]  # noqa: E731
        free = lambda engine=engine, ids=ids, draft=draft: _run(engine, ids, params, None, draft)[0]  # noqa: E731
        constrained(), free()  # warm up both paths
        pair = paired_median(constrained, free, runs)
        key = "with_draft" if draft else "alone"
        result[key] = round(pair["ratio"], 3)
        result[f"{key}_tps"] = (round(pair["ours"], 1), round(pair["theirs"], 1))
    return {"value": min(result["alone"], result["with_draft"]), **result, "tokens": tokens,
            "model": f"{TWIN} twin, float32; draft its 4-bit copy, k={DRAFT_K}", "goal": ">= 0.9"}


@contextmanager
def _timed_masks(samples: list[float]):
    """Time every ``Constraint.fill`` (the matcher's mask for one position) while in the block."""
    real = Constraint.fill

    def timed(self, bits):
        start = time.perf_counter()
        real(self, bits)
        samples.append(time.perf_counter() - start)
    Constraint.fill = timed
    try:
        yield
    finally:
        Constraint.fill = real


def grammar_mask_us(tokens: int = 256) -> dict:
    """p50 and p99 microseconds of one next-token mask, greedy and sampled, target alone."""
    engine, ids = _engine(False)
    samples: list[float] = []
    with _timed_masks(samples):
        for params in (GenerationParams(max_tokens=tokens),
                       GenerationParams(max_tokens=tokens, temperature=0.6, top_p=0.95, top_k=20, seed=0)):
            _run(engine, ids, params, json_schema(SCHEMA), False)
    ordered = sorted(samples)
    p50, p99 = statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]
    return {"value": round(p50 * 1e6, 1), "p50_us": round(p50 * 1e6, 1), "p99_us": round(p99 * 1e6, 1),
            "masks": len(ordered), "model": f"{TWIN} twin (vocabulary 151,936)"}


def grammar_spec_accept(tokens: int = 64) -> dict:
    """Draft tokens accepted per round under ``SCHEMA`` (k fixed), draft constrained and not; greedy and
    at Qwen3's sampling; and free for reference."""
    engine, ids = _engine(True)
    grammar, figures = json_schema(SCHEMA), {}
    for name, params in (("greedy", GenerationParams(max_tokens=tokens)),
                         ("t06", GenerationParams(max_tokens=tokens, temperature=0.6, top_p=0.95, top_k=20, seed=0))):
        for label, constrained, gram in (("constrained", True, grammar), ("unconstrained", False, grammar),
                                         ("free", True, None))[: 3 if name == "greedy" else 2]:
            stats = _run(engine, ids, params, gram, True, constrain_draft=constrained)[1].stats
            rounds = sum(1 for k in stats.draft_lengths if k)
            figures[f"{name}_{label}"] = round(stats.draft_accepted / max(rounds, 1), 2)
    return {"value": figures["greedy_constrained"], **figures, "k": DRAFT_K,
            "model": f"{TWIN} twin, float32; draft its 4-bit copy"}
