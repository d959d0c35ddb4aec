"""The prefill forward pass on MLX's CPU backend: mlx-lm's Qwen3 layers with a cheaper exp.

mlx-lm's layers compute attention's softmax and SwiGLU's SiLU with MLX's own
``exp``/``sigmoid``, which MLX's x86 CPU backend evaluates one element at a
time: with OpenBLAS doing the products, they were ~70% of a prefill. Here the
two run on ``fast_exp`` (whole-array multiplies and adds); everything else
(norms, projections, RoPE, the cache update) is the model's own modules.
Values match mlx-lm's to float32 rounding (tests compare caches and tokens).

Used for float32 Qwen3-layout models with a plain causal mask (full-attention
caches, any length); anything else, and the GPU, goes through the model as is.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from mlxcore.compiled_forward import has_qwen3_layout
from mlxcore.fast_exp import fast_silu, fast_softmax

# Attention scores per block of query rows: 2**17 float32 (512 KiB) stay in a core's L2 cache through
# softmax's passes. Measured against MLX's attention at 128 queries: 0.4-0.8 of its time from 128 to
# 2,816 keys; with the whole score matrix as one block, 1.3-1.7 times its time beyond 512 keys.
SCORES_PER_BLOCK = 1 << 17


def uses_cpu_prefill(model: nn.Module, cache_layers: list) -> bool:
    """Whether ``cpu_prefill_body`` applies to this model and these caches."""
    return (mx.default_device() == mx.cpu and has_qwen3_layout(model)
            and model.model.embed_tokens.weight.dtype == mx.float32
            and not any(hasattr(layer, "bits") for layer in cache_layers))  # quantized caches: their own attention


def _causal_attention(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """Softmax attention; query i sees keys up to S - L + i (the queries are the last L positions).

    q: (1, heads, L, dim); k, v: (1, kv_heads, S, dim); grouped heads share a kv head.
    The queries go in blocks of rows whose scores stay in the CPU's cache across softmax's
    passes (each row's softmax is its own, so blocks change no value).
    """
    n, s = q.shape[2], k.shape[2]
    rows = max(1, SCORES_PER_BLOCK // (q.shape[1] * s))
    if rows >= n:
        return _attention_rows(q, k, v, scale, 0, n)
    return mx.concatenate([_attention_rows(q[:, :, i:i + rows], k, v, scale, i, n)
                           for i in range(0, n, rows)], axis=2)


def _attention_rows(q: mx.array, k: mx.array, v: mx.array, scale: float, first: int, n: int) -> mx.array:
    """Rows ``first``.. of the L = ``n`` queries; q: (1, heads, rows, dim)."""
    b, heads, rows, dim = q.shape
    kv_heads, s = k.shape[1], k.shape[2]
    group = heads // kv_heads
    q = (q * scale).reshape(b, kv_heads, group * rows, dim)  # (1, kv_heads, group * rows, dim)
    scores = (q @ k.swapaxes(-1, -2)).reshape(b, kv_heads, group, rows, s)
    visible = mx.arange(s)[None] <= mx.arange(first, first + rows)[:, None] + (s - n)  # (rows, S)
    scores = mx.where(visible, scores, -mx.inf)
    weights = fast_softmax(scores).reshape(b, kv_heads, group * rows, s)
    return (weights @ v).reshape(b, heads, rows, dim)


def _layer(layer: nn.Module, h: mx.array, mask: Any, cache: Any) -> mx.array:
    """mlx-lm's ``TransformerBlock.__call__`` with the two exp-heavy steps swapped."""
    attn, mlp = layer.self_attn, layer.mlp
    b, n, _ = h.shape
    x = layer.input_layernorm(h)
    q = attn.q_norm(attn.q_proj(x).reshape(b, n, attn.n_heads, -1)).transpose(0, 2, 1, 3)
    k = attn.k_norm(attn.k_proj(x).reshape(b, n, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
    v = attn.v_proj(x).reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q, k = attn.rope(q, offset=cache.offset), attn.rope(k, offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    if mask == "causal":
        attended = _causal_attention(q, k, v, attn.scale)
    else:  # one token (no mask) or a cache's own mask array (a sliding window)
        attended = mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask=mask)
    h = h + attn.o_proj(attended.transpose(0, 2, 1, 3).reshape(b, n, -1))
    x = layer.post_attention_layernorm(h)
    return h + mlp.down_proj(fast_silu(mlp.gate_proj(x)) * mlp.up_proj(x))


def cpu_prefill_body(model: nn.Module, inputs: mx.array, cache_layers: list) -> mx.array:
    """Like ``model.model(inputs, cache=cache_layers)``: the final hidden states, (1, L, hidden)."""
    body = model.model
    h = body.embed_tokens(inputs)
    mask = create_attention_mask(h, cache_layers[0])
    for layer, cache in zip(body.layers, cache_layers):
        h = _layer(layer, h, mask, cache)
    return body.norm(h)
