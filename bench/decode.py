"""Row `decode_vs_mlx_lm`: plain decode tok/s, this Engine / mlx_lm.stream_generate."""

from __future__ import annotations

import copy

from mlx_lm import stream_generate

from bench.timing import paired_median, stream_rate
from mlxcore.chat_template import render_chat
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams

PROMPT = "Tell me about the planets, one by one, with their order from the sun."


def decode_vs_mlx_lm(model_ref: str, runs: int, tokens: int = 256, kv: str = "paged") -> dict:
    """Same model, same templated prompt, greedy, exactly ``tokens`` tokens each (EOS ignored by both)."""
    loaded = load_model(model_ref)
    ids = render_chat(loaded.tokenizer, [{"role": "user", "content": PROMPT}], enable_thinking=False)
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind=kv))
    engine.eos_ids = set()  # both sides run to exactly `tokens` tokens
    their_tokenizer = copy.copy(loaded.tokenizer)
    their_tokenizer.eos_token_ids = set()
    params = GenerationParams(max_tokens=tokens)

    def ours() -> float:
        events = engine.generate(ids, engine.new_caches(), params)
        return stream_rate(events, lambda e: isinstance(e, TokenEvent))[0]

    def theirs() -> float:
        return stream_rate(stream_generate(loaded.model, their_tokenizer, ids, max_tokens=tokens))[0]

    ours(), theirs()  # warm up both paths
    result = paired_median(ours, theirs, runs)
    return {"value": result["ratio"], "ours_tps": result["ours"], "mlx_lm_tps": result["theirs"],
            "ratios": result["ratios"], "kv": kv, "tokens": tokens, "model": model_ref}
