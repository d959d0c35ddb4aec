"""Where a 256-token prefill of the embedded target spends its time on MLX's CPU backend.

Usage: .venv/bin/python bench/studies/prefill_parts.py
Times the pieces of one layer on arrays of the embedded target's shapes (best of five), MLX's
exp-based functions beside mlxchat's (``mlxcore/fast_exp.py``), then the whole prefill through
mlx-lm's model and through ``mlxcore.prefill`` (rows of the batched pass), so the share of exp can be read off.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import mlxcore  # noqa: F401  (loads OpenBLAS before MLX)
import mlx.core as mx
import mlx.nn as nn

from mlxcore.engine import Engine, KVConfig
from mlxcore.loading import load_model
import mlxcore.prefill
from mlxcore.fast_exp import fast_silu, fast_softmax

TOKENS = 256


def best_ms(fn, repeats: int = 30) -> float:
    for _ in range(3):
        mx.eval(fn())
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            mx.eval(fn())
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1e3


def main() -> None:
    loaded = load_model("mini-target")
    a = loaded.model.args
    scores = mx.random.normal((a.num_attention_heads, TOKENS, TOKENS))
    gate = mx.random.normal((TOKENS, a.intermediate_size))
    x = mx.random.normal((TOKENS, a.hidden_size))
    w = mx.random.normal((a.intermediate_size, a.hidden_size))
    parts = {
        "softmax over the attention scores": lambda: mx.softmax(scores, axis=-1),
        "  the same, fast_softmax": lambda: fast_softmax(scores),
        "SiLU of the gate": lambda: nn.silu(gate),
        "  the same, fast_silu": lambda: fast_silu(gate),
        "one product, hidden -> intermediate": lambda: x @ w.T,
        "an add of the scores' size (for scale)": lambda: scores + 1,
    }
    for name, fn in parts.items():
        print(f"{name:42s} {best_ms(fn):7.2f} ms per layer")
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="standard"))
    ids = [(i * 7919) % a.vocab_size for i in range(TOKENS)]
    theirs = SimpleNamespace(split=False, model=loaded.model.model)  # prefill() runs a model not split here whole
    for name, forward in (("mlx-lm's model", theirs), ("mlxchat's layers", engine.target_forward)):
        seconds = []
        for _ in range(6):
            cache = engine.new_caches().target
            start = time.perf_counter()
            mlxcore.prefill.prefill(forward, cache, ids, chunk=128)
            seconds.append(time.perf_counter() - start)
        print(f"whole prefill, {TOKENS} tokens, {name:16s} {min(seconds[1:]) * 1e3:11.1f} ms")

if __name__ == "__main__":
    main()
