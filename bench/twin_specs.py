"""What a twin is: the real model's vocabulary and KV geometry, with narrow hidden and MLP widths.

A twin stands in for one of the users' mlx-community models. Everything that
decides KV bytes per token (layers x KV heads x head dim), the vocabulary and
the query-head count is the real model's; only the widths that leave those
alone are shrunk, so a twin builds in seconds and decodes quickly on a CPU.
No MLX here: the config is plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QWEN3_VOCAB = 151_936  # embedding rows of every Qwen3 model (the tokenizer itself has 151,669 ids)
BOS_ID = 151_643  # <|endoftext|>, also Qwen3's pad token
EOS_ID = 151_645  # <|im_end|>
GROUP_SIZE = 64  # mlx-community's 4-bit repos: affine, 64 weights per scale/bias pair
TRANSFORMERS_VERSION = "4.51.0"  # what Qwen3's own config files name


@dataclass(frozen=True)
class LinearLayers:
    """A hybrid model's Gated DeltaNet layers (Qwen3.5): real, they decide the recurrent state per sequence."""

    key_heads: int
    value_heads: int
    key_dim: int = 128  # per head
    value_dim: int = 128
    conv_kernel: int = 4
    full_attention_interval: int = 4  # every fourth layer is full attention
    partial_rotary_factor: float = 0.25  # the full-attention layers rotate a quarter of each head


@dataclass(frozen=True)
class TwinSpec:
    """The shape of one twin; the folder's config.json is made from it."""

    mirrors: str  # the hub repo this twin stands in for
    num_layers: int  # real: decides KV bytes per token
    kv_heads: int  # real: decides KV bytes per token
    head_dim: int  # real: decides KV bytes per token
    num_heads: int  # query heads, real: attention and CPU prefill cost scale with them
    hidden_size: int  # shrunk (real: 4096 / 1024): residual stream width
    intermediate_size: int  # shrunk (real: 12288 / 3072): MLP width
    tie_embeddings: bool  # real: the 0.6B reuses its embedding as the output layer
    vocab_size: int = QWEN3_VOCAB  # real: embedding and output rows
    max_position_embeddings: int = 40_960  # real: Qwen3's native context
    rope_theta: float = 1_000_000.0  # real
    rms_norm_eps: float = 1e-6  # real
    linear: LinearLayers | None = None  # a hybrid model's linear layers (Qwen3.5); None: Qwen3

    def __post_init__(self) -> None:
        sizes = {name: getattr(self, name) for name in
                 ("num_layers", "kv_heads", "head_dim", "num_heads", "hidden_size",
                  "intermediate_size", "vocab_size", "max_position_embeddings")}
        if any(size <= 0 for size in sizes.values()):
            raise ValueError(f"every size of a twin must be positive, got {sizes}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"{self.num_heads} query heads cannot share {self.kv_heads} KV heads evenly")
        for name in ("hidden_size", "intermediate_size"):
            if getattr(self, name) % GROUP_SIZE:
                raise ValueError(f"{name} must be a multiple of {GROUP_SIZE} so that 4-bit "
                                 f"quantization covers every matrix, as in the real repos")


TWINS: dict[str, TwinSpec] = {
    "qwen3-8b": TwinSpec(mirrors="mlx-community/Qwen3-8B-4bit", num_layers=36, kv_heads=8,
                         head_dim=128, num_heads=32, hidden_size=64, intermediate_size=192,
                         tie_embeddings=False),
    "qwen3-0.6b": TwinSpec(mirrors="mlx-community/Qwen3-0.6B-4bit", num_layers=28, kv_heads=8,
                           head_dim=128, num_heads=16, hidden_size=64, intermediate_size=192,
                           tie_embeddings=True),
    # Qwen3.5's geometry as ports list it (Qwen/Qwen3.5-9B and -0.8B; the hub's config.json cannot be read
    # here): its own 248,320-token vocabulary and tokenizer are not in this tree, so Qwen3's stand in.
    "qwen3.5-9b": TwinSpec(mirrors="Qwen/Qwen3.5-9B", num_layers=32, kv_heads=4, head_dim=256, num_heads=16,
                           hidden_size=64, intermediate_size=192, tie_embeddings=False, max_position_embeddings=262_144,
                           rope_theta=10_000_000.0, linear=LinearLayers(key_heads=16, value_heads=32)),
    "qwen3.5-0.8b": TwinSpec(mirrors="Qwen/Qwen3.5-0.8B", num_layers=24, kv_heads=2, head_dim=256, num_heads=8,
                             hidden_size=64, intermediate_size=192, tie_embeddings=True,
                             max_position_embeddings=262_144, rope_theta=10_000_000.0,
                             linear=LinearLayers(key_heads=16, value_heads=16)),
}


def twin_config(spec: TwinSpec, *, bits: int | None, vocab_pad: int = 0) -> dict[str, Any]:
    """config.json for ``spec`` with the keys of Qwen3's own, or Qwen3.5's text model's for a hybrid twin
    (quantization is added by the builder)."""
    if spec.linear is not None:
        return _hybrid_config(spec, spec.linear, bits=bits, vocab_pad=vocab_pad)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.num_layers,
        "model_type": "qwen3",
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": spec.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": spec.tie_embeddings,
        "torch_dtype": "bfloat16" if bits else "float32",
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec.vocab_size + vocab_pad,
    }


def _hybrid_config(spec: TwinSpec, linear: LinearLayers, *, bits: int | None, vocab_pad: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5",
        "attention_bias": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "full_attention_interval": linear.full_attention_interval,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "linear_conv_kernel_dim": linear.conv_kernel,
        "linear_key_head_dim": linear.key_dim,
        "linear_num_key_heads": linear.key_heads,
        "linear_num_value_heads": linear.value_heads,
        "linear_value_head_dim": linear.value_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta,
                            "partial_rotary_factor": linear.partial_rotary_factor},
        "tie_word_embeddings": spec.tie_embeddings,
        "torch_dtype": "bfloat16" if bits else "float32",
        "vocab_size": spec.vocab_size + vocab_pad,
    }


def generation_config() -> dict[str, Any]:
    """generation_config.json as Qwen3's repos ship it (its recommended thinking-mode sampling)."""
    return {
        "bos_token_id": BOS_ID,
        "do_sample": True,
        "eos_token_id": [EOS_ID, BOS_ID],
        "pad_token_id": BOS_ID,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": TRANSFORMERS_VERSION,
    }
