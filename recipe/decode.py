"""Greedy decoding and timing with MLX, through mlx-lm's model and cache code."""

from __future__ import annotations

import time

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache


def greedy(model, prompt: list[int], eos: int, max_tokens: int = 160) -> list[int]:
    """Greedy continuation of ``prompt``, ending with ``eos`` unless ``max_tokens`` ran out."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(mx.argmax(logits[0, -1]).item())
        out.append(token)
        if token == eos:
            break
        logits = model(mx.array([[token]]), cache=cache)
    return out


def argmax_along(model, tokens: list[int]) -> list[int]:
    """The model's greedy next token after every prefix of ``tokens`` (one forward pass)."""
    logits = model(mx.array([tokens]))
    return mx.argmax(logits[0], axis=-1).tolist()


def _decode_run(model, prompt: list[int], tokens: int) -> float:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([prompt]), cache=cache))
    token = mx.array([[prompt[-1]]])
    start = time.perf_counter()
    for _ in range(tokens):
        token = mx.argmax(model(token, cache=cache)[:, -1:], axis=-1)
        mx.eval(token)
    return (time.perf_counter() - start) / tokens


def decode_seconds_per_token(models: dict, prompt: list[int], tokens: int = 32, rounds: int = 15) -> dict:
    """Per-token decode time with a KV cache, for each model: the fastest of ``rounds`` runs.

    Runs of the models are interleaved and the fastest kept, so that other work on the
    machine's shared cores disturbs every model alike and the least.
    """
    best = dict.fromkeys(models, float("inf"))
    for _ in range(rounds):
        for name, model in models.items():
            best[name] = min(best[name], _decode_run(model, prompt, tokens))
    return best
