"""Rows on the Qwen3.5-9B twin (hybrid layers, standard cache): ``hybrid_turn10_prefill_fraction``, the
tokens a 10-turn chat reads at turn 10 (``session_turns``' long row), and ``hybrid_snapshot_bytes_per_token``,
what the linear states' snapshots hold beside the attention layers' KV.

Snapshots are taken where a pass follows a pass of several tokens: each prompt chunk's start and the prompt's
end (``mlxcore/kv/hybrid.py``), so in a chat about one a turn, at most ``MAX_SNAPSHOTS``. Replies are shaped by
``scripted_replies`` (a think block, no chat markup) with end of text ignored: a random twin's own replies
would end at once or write markup.
"""

from __future__ import annotations

from bench.scripted_replies import scripted_replies
from bench.session_turns import converse, turn10_prefill_fraction_long
from bench.twins import twin_folder
from mlxcore.engine import KVConfig
from mlxcore.kv.hybrid import MAX_SNAPSHOTS, HybridCache
from mlxcore.launch import ModelChoice, open_engine

TWIN = "qwen3.5-9b"


def hybrid_turn10_prefill_fraction(reply_tokens: int = 60, think_tokens: int = 30) -> dict:
    """Turn 10's prefilled / prompt tokens, thinking off (value) and on ('on', at most 'on_bound')."""
    folder = str(twin_folder(TWIN, bits=None))
    row = turn10_prefill_fraction_long(folder, kv="standard", reply_tokens=reply_tokens, think_tokens=think_tokens)
    return {**row, "model": f"{TWIN} twin, float32"}


def hybrid_snapshot_bytes_per_token(turns: int = 6, reply_tokens: int = 60, think_tokens: int = 30) -> dict:
    """Bytes the snapshots hold / bytes of the attention KV, after ``turns`` turns with thinking on; and one set
    of linear states in tokens of attention KV (what a snapshot per block would cost)."""
    engine = open_engine(ModelChoice(model=str(twin_folder(TWIN, bits=None)), no_draft=True),
                         KVConfig(kind="standard")).engine
    engine.eos_ids = set()
    with scripted_replies(engine.tokenizer, thinking=True, think_tokens=think_tokens):
        session, _ = converse(engine, turns, max_tokens=reply_tokens, thinking=True)
    cache = session.caches.target
    assert isinstance(cache, HybridCache)
    kv_token = cache.geometry.token_bytes
    one_set = sum(state.nbytes for state in cache.states)
    held = sum(sum(state.nbytes for state in states) for _, states in cache.snapshots)
    return {"value": held / (kv_token * cache.offset), "snapshots": len(cache.snapshots),
            "max_snapshots": MAX_SNAPSHOTS, "tokens": cache.offset, "set_bytes": one_set,
            "kv_bytes_per_token": kv_token, "set_in_kv_tokens": one_set / kv_token,
            "model": f"{TWIN} twin, float32"}
