"""The prefill forward pass on MLX's CPU backend: mlx-lm's Qwen3 layers with a cheaper exp.

mlx-lm's layers compute attention's softmax and SwiGLU's SiLU with MLX's own
``exp``/``sigmoid``, which MLX's x86 CPU backend evaluates one element at a
time: with OpenBLAS doing the products, they were ~70% of a prefill. Here the
two run on ``fast_exp`` (whole-array multiplies and adds), attention in blocks
of keys that stay in cache (``decode_attention.attend``, which takes ``cpu_attention``
for a causal chunk on the CPU); everything else (norms,
projections, RoPE, the cache update) is the model's own modules.
Values match mlx-lm's to float32 rounding (tests compare caches and tokens).

Used for float32 Qwen3-layout models with a plain causal mask (full-attention
caches, any length) where the device profile takes ``fast_exp``; anything else goes through the model as is.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from mlxcore.compiled_forward import has_qwen3_layout
from mlxcore.decode_attention import attend
from mlxcore.device_profile import current
from mlxcore.fast_exp import fast_silu
from mlxcore.kv.protocol import LayerCache, Mask


def uses_cpu_prefill(model: nn.Module, cache_layers: list) -> bool:
    """Whether ``cpu_prefill_body`` applies to this model and these caches."""
    return (current().fast_exp and has_qwen3_layout(model)
            and model.model.embed_tokens.weight.dtype == mx.float32
            # mlx-lm's quantized caches take its own attention; ours hand their runs over (update_and_segments)
            and not any(hasattr(layer, "bits") and not hasattr(layer, "update_and_segments") for layer in cache_layers))


def _layer(layer: nn.Module, h: mx.array, mask: Mask, cache: LayerCache) -> mx.array:
    """mlx-lm's ``TransformerBlock.__call__`` with the two exp-heavy steps swapped."""
    attn, mlp = layer.self_attn, layer.mlp
    b, n, _ = h.shape
    x = layer.input_layernorm(h)
    q = attn.q_norm(attn.q_proj(x).reshape(b, n, attn.n_heads, -1)).transpose(0, 2, 1, 3)
    k = attn.k_norm(attn.k_proj(x).reshape(b, n, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
    v = attn.v_proj(x).reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q, k = attn.rope(q, offset=cache.offset), attn.rope(k, offset=cache.offset)
    if hasattr(cache, "update_and_segments"):  # a paged cache hands over its runs of blocks as views
        segments = cache.update_and_segments(k, v)
    else:
        segments = [cache.update_and_fetch(k, v)]
    attended = attend(q, segments, attn.scale, mask)  # a chunk: key blocks that stay in cache (cpu_attention)
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
