"""The shape of a model's KV cache, read from its config: layers, KV heads, head size, dtype; and its format."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from mlxcore.kv.errors import CacheShapeError
from mlxcore.kv.kv_format import KVFormat, kv_format


@dataclass(frozen=True)
class KVGeometry:
    """What one token costs in one layer's cache, and how many layers there are."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: mx.Dtype  # the dtype attention computes in (the model's activation dtype)
    format: KVFormat = KVFormat()  # how keys and values are stored: float, or quantized

    @property
    def token_bytes(self) -> int:
        """Bytes of keys and values of one token across all layers, as stored."""
        return self.num_layers * self.format.token_bytes(self.kv_heads, self.head_dim, self.dtype.size)

    def check(self, keys: mx.array, values: mx.array, where: str) -> None:
        """Raise ``CacheShapeError`` unless keys/values are (1, kv_heads, L, head_dim) in ``dtype``."""
        expected = (1, self.kv_heads, keys.shape[2] if keys.ndim == 4 else -1, self.head_dim)
        for name, array in (("keys", keys), ("values", values)):
            if array.shape != expected or array.dtype != self.dtype:
                raise CacheShapeError(
                    f"{where}: {name} of shape {tuple(array.shape)} and dtype {array.dtype}; this cache "
                    f"holds (1, {self.kv_heads}, L, {self.head_dim}) in {self.dtype}.")


def model_geometry(model: nn.Module, kv_bits: int | None = None) -> KVGeometry:
    """The KV geometry of an mlx-lm model (Qwen3 and models with the same config names), its keys and values
    stored in ``kv_bits`` (None: float; ``KVFormatError`` if the model's heads cannot take it).

    A model sharded over ranks (``model.shard``) holds only its share of the KV heads: its layers say how many.
    """
    args = model.args
    heads = args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // heads
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    attention = [layer for layer in model.layers if hasattr(layer, "self_attn")]  # a hybrid model's linear ones hold none
    layer = attention[0].self_attn  # sharded: this rank's (Qwen3's n_kv_heads; Qwen3.5's and Qwen3-Next's own name)
    kv_heads = getattr(layer, "n_kv_heads", None) or getattr(layer, "num_key_value_heads", kv_heads)
    return KVGeometry(len(attention), kv_heads, head_dim, activation_dtype(model), kv_format(kv_bits, head_dim))


def activation_dtype(model: nn.Module) -> mx.Dtype:
    """The dtype of the model's activations: its embedding's (a quantized one's scales)."""
    embed = model.model.embed_tokens
    dtype: mx.Dtype = getattr(embed, "scales", embed.weight).dtype
    return dtype
