"""Row ``hybrid_spec_vs_plain``: speculative / plain greedy decode tok/s on the Qwen3.5-9B twin (hybrid layers).

Random weights accept no draft token by chance, so the draft that agrees is built to: the target's first
``DRAFT_LAYERS`` layers (three linear, one full attention) with its embedding, norm and head, while every later
layer of the target writes nothing to the residual stream (its attention's and MLP's output projections are
zero). The target still computes all its layers; its logits are the draft's, so greedy drafts are accepted and
the row measures what the speculative loop and the hybrid cache's marks cost and save. The draft that does not
agree is the Qwen3.5-0.8B twin (random weights, the same tokenizer): nearly every round rewinds to its mark
and re-feeds, and the adaptive draft length has to keep the loss small.
"""

from __future__ import annotations

import copy

import mlx.core as mx
from mlx.utils import tree_flatten

from bench.decode import PROMPT
from bench.timing import paired_median, stream_rate
from bench.twins import twin_folder
from mlxcore.chat_template import render_chat
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams

DRAFT_LAYERS = 4


def agreeing_pair(model, layers: int = DRAFT_LAYERS):
    """(target, draft): ``model`` with its layers after the first ``layers`` silenced, and a draft of those."""
    args = copy.copy(model.args)
    args.num_hidden_layers = layers
    draft = type(model)(args)
    draft.load_weights([(name, value) for name, value in tree_flatten(model.parameters())
                        if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers])
    for layer in model.model.layers[layers:]:
        mixer = layer.linear_attn.out_proj if hasattr(layer, "linear_attn") else layer.self_attn.o_proj
        for projection in (mixer, layer.mlp.down_proj):
            projection.weight = mx.zeros_like(projection.weight)
    mx.eval(model.parameters(), draft.parameters())
    return model, draft


def hybrid_spec_vs_plain(runs: int, tokens: int = 128) -> dict:
    target = load_model(str(twin_folder("qwen3.5-9b", bits=None)))
    other = load_model(str(twin_folder("qwen3.5-0.8b", bits=None)))
    model, agreeing = agreeing_pair(target.model)
    ids = render_chat(target.tokenizer, [{"role": "user", "content": PROMPT}], enable_thinking=False)
    params = GenerationParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    kv = KVConfig(kind="standard")
    engines = {"plain": Engine(model, target.tokenizer, kv=kv),
               "agreeing": Engine(model, target.tokenizer, kv=kv, draft_model=agreeing),
               "other": Engine(model, target.tokenizer, kv=kv, draft_model=other.model)}

    def rate(name: str):
        def run() -> float:
            engine = engines[name]
            return stream_rate(engine.generate(ids, engine.new_caches(), params), lambda e: isinstance(e, TokenEvent))[0]
        return run

    for name in engines:
        rate(name)()  # warm up; the draft lengths learn
    agree = paired_median(rate("agreeing"), rate("plain"), runs)
    disagree = paired_median(rate("other"), rate("plain"), runs)
    agreed, other_stats = engines["agreeing"].last_stats, engines["other"].last_stats
    return {"value": agree["ratio"], "disagreeing": disagree["ratio"], "plain_tps": agree["theirs"],
            "agreeing_tps": agree["ours"], "disagreeing_tps": disagree["ours"],
            "agreeing_acceptance": agreed.acceptance, "disagreeing_acceptance": other_stats.acceptance,
            "agreeing_k": list(agreed.draft_lengths[-8:]), "disagreeing_k": list(other_stats.draft_lengths[-8:]),
            "ratios": agree["ratios"], "disagreeing_ratios": disagree["ratios"], "tokens": tokens,
            "model": f"qwen3.5-9b twin, float32; drafts: its first {DRAFT_LAYERS} layers, the 0.8B twin"}
