"""Rows `lookup_speedup_edit` and `lookup_worst_case`: prompt lookup (`--draft lookup`) against plain decoding.

- ``lookup_speedup_edit``: a reply that writes out again a 1,500-token text given in its prompt, with small
  changes (one token in 50 of the text differs from what the model writes). No trained model here rewrites
  such a text, so the model is built to: the 0.6B twin's geometry (28 layers, its KV heads, Qwen3's
  151,936-token vocabulary) whose layers compute as any layer does but add nothing to the residual
  stream, and whose embedding and output rows map each of 1,024 tokens to the next of a fixed text (a
  random order of them). Whatever the prompt, it writes that text on from its last token; the prompt holds
  the text, edited. Greedy decode tok/s with lookup / without, paired runs.
- ``lookup_worst_case``: the embedded target answering the chat questions (replies that repeat little):
  decode tok/s with lookup / without. Lookup's rounds must pay or not be taken (goal >= 0.97).
"""

from __future__ import annotations

import numpy as np

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3

from bench.prompts import chat_prompts
from bench.speculative import _ours, _rate_over_prompts
from bench.timing import paired_median
from bench.twin_specs import TWINS, twin_config
from mlxcore.engine import Engine, KVConfig
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams

TEXT_TOKENS = 1024  # the fixed text's distinct tokens
EDIT_EVERY = 50  # one token in this many of the prompt's text differs from what the model writes
SCALE = 8.0  # output rows' weight: after RMSNorm a token's own direction reads ~8, logits ~64 against < ~30


def text_model(seed: int = 0) -> tuple[qwen3.Model, list[int]]:
    """The 0.6B twin's geometry writing a fixed text (see the module docstring); the model and the text."""
    spec = TWINS["qwen3-0.6b"]
    config = twin_config(spec, bits=None) | {"tie_word_embeddings": False}  # (the same products as tied ones)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    # The layers' output projections are zero: attention and the MLP run, and add nothing.
    model.update(tree_unflatten([(name, mx.zeros(value.shape)) for name, value in tree_flatten(model.parameters())
                                 if name.endswith(("o_proj.weight", "down_proj.weight"))]))
    text = rng.choice(np.arange(1000, spec.vocab_size), size=TEXT_TOKENS, replace=False).tolist()
    directions = rng.standard_normal((TEXT_TOKENS, spec.hidden_size)).astype(np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    embed = np.zeros((spec.vocab_size, spec.hidden_size), dtype=np.float32)
    embed[:] = directions[0]  # a token outside the text leads to the text's second token
    embed[text] = directions
    head = np.zeros((spec.vocab_size, spec.hidden_size), dtype=np.float32)
    head[text[1:] + text[:1]] = SCALE * directions  # token text[i]'s direction names text[i + 1]
    model.model.embed_tokens.weight = mx.array(embed)
    model.lm_head.weight = mx.array(head)
    mx.eval(model.parameters())
    return model, text


def edited_prompt(text: list[int], length: int, seed: int) -> list[int]:
    """``length`` tokens of the text from its start, round again as needed, one in ``EDIT_EVERY`` replaced by
    another of its tokens (a substitution: the text goes on as it was after it)."""
    rng = np.random.default_rng(seed)
    prompt = [text[i % len(text)] for i in range(length)]
    for at in range(rng.integers(EDIT_EVERY), length - 1, EDIT_EVERY):
        prompt[at] = text[int(rng.integers(len(text)))]
    return prompt


def lookup_speedup_edit(runs: int, prompt_tokens: int = 1500, reply_tokens: int = 256) -> dict:
    model, text = text_model()
    kv = KVConfig(kind="paged")
    lookup, plain = Engine(model, None, kv=kv, prompt_lookup=True), Engine(model, None, kv=kv)
    for engine in (lookup, plain):
        engine.eos_ids = set()
    params = GenerationParams(max_tokens=reply_tokens)
    prompts = [edited_prompt(text, prompt_tokens, seed) for seed in range(2)]
    ours, theirs = _ours(lookup, params), _ours(plain, params)
    _rate_over_prompts(ours, prompts[:1]), _rate_over_prompts(theirs, prompts[:1])  # warm up, learn k
    r = paired_median(lambda: _rate_over_prompts(ours, prompts), lambda: _rate_over_prompts(theirs, prompts), runs)
    stats = lookup.last_stats
    return {"value": r["ratio"], "lookup_tps": r["ours"], "plain_tps": r["theirs"], "ratios": r["ratios"],
            "accepted": stats.draft_accepted if stats else None, "proposed": stats.draft_proposed if stats else None,
            "prompt_tokens": prompt_tokens, "reply_tokens": reply_tokens}


def lookup_worst_case(target_ref: str, runs: int, tokens: int = 200) -> dict:
    target = load_model(target_ref)
    kv = KVConfig(kind="paged")
    lookup = Engine(target.model, target.tokenizer, kv=kv, prompt_lookup=True)
    plain = Engine(target.model, target.tokenizer, kv=kv)
    params = GenerationParams(max_tokens=tokens)
    prompts = chat_prompts(target.tokenizer)
    ours, theirs = _ours(lookup, params), _ours(plain, params)
    _rate_over_prompts(ours, prompts[:2]), _rate_over_prompts(theirs, prompts[:2])  # warm up, learn k
    r = paired_median(lambda: _rate_over_prompts(ours, prompts), lambda: _rate_over_prompts(theirs, prompts), runs)
    stats = lookup.last_stats
    return {"value": r["ratio"], "lookup_tps": r["ours"], "plain_tps": r["theirs"], "ratios": r["ratios"],
            "accepted": stats.draft_accepted if stats else None, "proposed": stats.draft_proposed if stats else None}
