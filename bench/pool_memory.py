"""Row `pool_peak_vs_held`: the most KV memory a chat takes while it grows from 0 to 3,000 tokens,
divided by the bytes its tokens hold at the end.

One engine (the embedded target and its draft, paged caches in one byte budget)
holds a chat that grows by turns: a user message of ``user`` tokens, then a
greedy reply of ``reply`` tokens, speculative as the chat window decodes, until
the caches hold ``tokens`` tokens. The peak is the budget's own account (slabs
of both pools, taken before they are allocated), checked
against what MLX reports: the active memory the pools' arrays hold at the end.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.kv.paged_pool import make_block_pool
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams


def pool_peak_vs_held(model_ref: str, draft_ref: str | None, tokens: int = 3000, user: int = 100,
                      reply: int = 200, slab_blocks: int | None = None) -> dict:
    """Peak KV bytes / bytes the tokens hold (see the module docstring); ``slab_blocks`` overrides the slab size."""
    loaded, draft = load_model(model_ref), load_model(draft_ref) if draft_ref else None
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"),
                    draft_model=draft.model if draft else None)
    engine.eos_ids = set()  # every reply has its full length
    vocab = loaded.model.args.vocab_size
    mx.synchronize()
    before = mx.get_active_memory()
    if slab_blocks is not None:  # the engine's pools, made here with other slabs (engine.new_caches uses them)
        models = {"target": engine.model, "draft": engine.draft_model}
        engine._pools = {role: make_block_pool(model, slab_blocks=slab_blocks, budget=engine.kv_budget)
                         for role, model in models.items() if model is not None}
    caches = engine.new_caches()
    ids: list[int] = []
    while len(ids) < tokens - 1:
        ids += [(len(ids) * 7919 + index) % (vocab - 1) + 1 for index in range(user)]
        wanted = min(reply, tokens - len(ids))
        for event in engine.generate(ids, caches, GenerationParams(max_tokens=wanted)):
            if isinstance(event, TokenEvent):
                ids.append(event.token)
    pools = [cache.pool for cache in (caches.target, caches.draft) if cache is not None]
    held = sum(cache.offset * cache.pool.geometry.token_bytes for cache in (caches.target, caches.draft)
               if cache is not None)
    mx.synchronize()
    budget = engine.kv_budget
    return {"value": budget.peak / held, "peak_bytes": budget.peak, "held_bytes": held,
            "tokens": caches.target.offset, "slab_blocks": pools[0].config.slab_blocks,
            "mlx_active_kv_bytes": mx.get_active_memory() - before,
            "pool_bytes": sum(pool.kv_bytes for pool in pools), "budget_bytes": budget.limit}

