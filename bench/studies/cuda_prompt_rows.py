"""Which operation of a pass of prompt rows fails on MLX's CUDA backend.

On an H200 (docs/cuda.md), a pass of 64 or more prompt rows raised ``cudaGraphAddKernelNode(...) failed:
invalid argument`` at its first layer's evaluation, under both device profiles; 48 rows passed. This runs
the first layer of the failing tests' model one operation at a time, each evaluated alone, for 48, 64 and
150 rows, then whole passes (each profile, compiled and not, a standard cache and a paged one), and prints
what failed. On the CPU everything passes.

    python bench/studies/cuda_prompt_rows.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlxcore  # noqa: F401  (before mlx)
import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from tiny_models import tiny_qwen3  # noqa: E402

from mlxcore import device_profile  # noqa: E402
from mlxcore.batching.batch_forward import BatchDecoder  # noqa: E402
from mlxcore.batching.prompt_feed import PromptFeed  # noqa: E402
from mlxcore.compiled_forward import CompiledForward  # noqa: E402
from mlxcore.kv.model_cache import make_model_cache  # noqa: E402


def layer_steps(model, rows: int):
    """(name, arrays) of the first layer's operations on ``rows`` prompt rows (a row a token), in order."""
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    h = model.model.embed_tokens((mx.arange(rows) % model.args.vocab_size)[:, None])
    yield "embed (rows, 1, hidden)", h
    normed = layer.input_layernorm(h)
    yield "input_layernorm", normed
    q, k, v = attn.q_proj(normed), attn.k_proj(normed), attn.v_proj(normed)
    yield "q, k, v projections", (q, k, v)
    q = attn.q_norm(q.reshape(rows, 1, attn.n_heads, -1)).transpose(0, 2, 1, 3)
    yield "q_norm", q
    k = attn.k_norm(k.reshape(rows, 1, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
    yield "k_norm", k
    v = v.reshape(rows, 1, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    offsets = mx.arange(rows, dtype=mx.int32)
    q = attn.rope(q, offset=offsets) * attn.scale
    yield "rope, an offset a row (queries)", q
    k = attn.rope(k, offset=offsets)
    yield "rope, an offset a row (keys)", k
    both = mx.concatenate([k, v], axis=2).transpose(2, 1, 0, 3)
    yield "keys and values stacked (2, kv_heads, rows, dim)", both
    queries, keys, values = q.transpose(2, 1, 0, 3), both[0][None], both[1][None]
    yield "queries as one sequence (1, heads, rows, dim)", queries
    causal = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=1.0, mask="causal")
    yield "fused attention, causal", causal
    mask = mx.tril(mx.ones((rows, rows), dtype=mx.bool_))
    yield "fused attention, an array mask", mx.fast.scaled_dot_product_attention(queries, keys, values, scale=1.0,
                                                                                  mask=mask)
    groups = attn.n_heads // attn.n_kv_heads
    scores = (queries.reshape(1, attn.n_kv_heads, groups, rows, -1) @ keys[:, :, None].swapaxes(-1, -2))
    yield "grouped scores", scores
    weights = mx.softmax(mx.where(mask, scores, -mx.inf), axis=-1)
    yield "grouped softmax", weights
    out = (weights @ values[:, :, None]).reshape(1, attn.n_heads, rows, -1)
    yield "grouped output", out
    h = h + attn.o_proj(causal.transpose(2, 1, 0, 3).transpose(0, 2, 1, 3).reshape(rows, 1, -1))
    yield "o_proj and residual", h
    normed = layer.post_attention_layernorm(h)
    yield "post_attention_layernorm", normed
    yield "mlp", mlp(normed)


def passes(model, rows: int):
    """(name, thunk) of whole passes of ``rows`` prompt rows."""
    ids = [i % model.args.vocab_size for i in range(rows)]
    for profile in ("cpu", "gpu"):
        for compiled in (True, False):
            for kind in ("standard", "paged"):
                def run(profile=profile, compiled=compiled, kind=kind):
                    (mx.enable_compile if compiled else mx.disable_compile)()
                    with device_profile.forced(profile):
                        forward = CompiledForward(model)
                        feed = PromptFeed(forward, make_model_cache(model, kind), ids)
                        BatchDecoder(forward)([], None, [feed])
                        mx.eval(feed.h)
                yield f"a pass, {profile} profile, {'compiled' if compiled else 'uncompiled'}, {kind} cache", run
    mx.enable_compile()


def main() -> None:
    print(mx.default_device(), mx.__version__)
    model = tiny_qwen3(seed=5, layers=3, heads=4, kv_heads=4)  # test_prefill_forward's failing case
    for rows in (48, 64, 150):
        for name, arrays in layer_steps(model, rows):
            try:
                mx.eval(arrays)
            except RuntimeError as error:
                print(f"{rows} rows: FAILED {name}: {error}")
        for name, run in passes(model, rows):
            try:
                run()
            except RuntimeError as error:
                print(f"{rows} rows: FAILED {name}: {error}")
        print(f"{rows} rows: done")


if __name__ == "__main__":
    main()
