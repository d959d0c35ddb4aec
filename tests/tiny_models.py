"""Tiny random-weight Qwen3 models, made in the test, for checks that need no trained weights."""

from __future__ import annotations

import json
from pathlib import Path

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3, qwen3_5, qwen3_moe, qwen3_next


def tiny_config(vocab_size: int = 384, layers: int = 2, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2, head_dim: int = 16) -> dict:
    """A Qwen3 config.json dict small enough to run in milliseconds."""
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 3,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 32768,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,  # tied random embeddings make the model echo its input
    }


def tiny_qwen3(seed: int = 0, **config) -> qwen3.Model:
    """A random-weight mlx-lm Qwen3 model; matrices scaled up so its logits are peaked, not flat."""
    mx.random.seed(seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(tiny_config(**config)))
    scaled = [(k, v * 2.0 if v.ndim == 2 and "embed" not in k else v)
              for k, v in tree_flatten(model.parameters())]
    model.load_weights(scaled)
    mx.eval(model.parameters())
    return model


def tiny_moe_config(vocab_size: int = 2048, kv_heads: int = 2) -> dict:
    """A Qwen3-MoE config.json dict: 2 layers of 4 experts (2 per token), small enough for milliseconds."""
    return tiny_config(vocab_size=vocab_size, kv_heads=kv_heads) | {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4,
        "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": 96,
        "norm_topk_prob": True}


def tiny_qwen3_moe(seed: int = 0, **config) -> qwen3_moe.Model:
    """A random-weight mlx-lm Qwen3-MoE model, scaled like ``tiny_qwen3``."""
    mx.random.seed(seed)
    model = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(tiny_moe_config(**config)))
    scaled = [(k, v * 2.0 if v.ndim >= 2 and "embed" not in k else v) for k, v in tree_flatten(model.parameters())]
    model.load_weights(scaled)
    mx.eval(model.parameters())
    return model


def tiny_hybrid_config(vocab_size: int = 2048, layers: int = 4) -> dict:
    """A Qwen3.5 config.json dict (text only): three Gated DeltaNet linear layers in four, then full attention
    (gated, partial rotary), small enough for milliseconds."""
    return {"model_type": "qwen3_5", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
            "vocab_size": vocab_size, "max_position_embeddings": 32768, "linear_num_value_heads": 4,
            "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "tie_word_embeddings": False,
            "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}


def tiny_hybrid_moe_config(vocab_size: int = 2048) -> dict:
    """Qwen3.5-MoE's: ``tiny_hybrid_config`` with 4 experts (2 a token) and a shared expert in every layer."""
    return tiny_hybrid_config(vocab_size) | {"model_type": "qwen3_5_moe", "num_experts": 4, "num_experts_per_tok": 2,
                                              "moe_intermediate_size": 96, "shared_expert_intermediate_size": 96}


def tiny_qwen3_next_config(vocab_size: int = 2048) -> dict:
    """A Qwen3-Next config.json dict: ``tiny_hybrid_config``'s layers (Qwen3-Next's own gated attention and
    Gated DeltaNet modules) with a sparse expert block and a shared expert in every layer."""
    return {"model_type": "qwen3_next", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
            "vocab_size": vocab_size, "max_position_embeddings": 32768, "linear_num_value_heads": 4,
            "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "tie_word_embeddings": False,
            "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "moe_intermediate_size": 96, "shared_expert_intermediate_size": 96, "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25, "norm_topk_prob": True}


def tiny_qwen3_next(seed: int = 0) -> qwen3_next.Model:
    """A random-weight mlx-lm Qwen3-Next model (``tiny_qwen3_next_config``), matrices scaled like ``tiny_qwen3``."""
    mx.random.seed(seed)
    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(tiny_qwen3_next_config()))
    scaled = [(k, v * 2.0 if v.ndim >= 2 and "embed" not in k else v) for k, v in tree_flatten(model.parameters())]
    model.load_weights(scaled)
    mx.eval(model.parameters())
    return model


def tiny_hybrid(seed: int = 0, config: dict | None = None) -> qwen3_5.Model:
    """A random-weight mlx-lm Qwen3.5 model (``config``: default ``tiny_hybrid_config()``), matrices scaled like
    ``tiny_qwen3``."""
    mx.random.seed(seed)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config or tiny_hybrid_config()))
    scaled = [(k, v * 2.0 if v.ndim >= 2 and "embed" not in k else v) for k, v in tree_flatten(model.parameters())]
    model.load_weights(scaled)
    mx.eval(model.parameters())
    return model


def write_model_folder(model, folder: Path, tokenizer_from: Path, config: dict | None = None) -> Path:
    """Save ``model`` in the MLX layout, with the tokenizer files copied from ``tokenizer_from``;
    ``config``: its config.json (default: ``tiny_config`` of the model's sizes)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = config or tiny_config(vocab_size=model.args.vocab_size, layers=model.args.num_hidden_layers,
                                   hidden=model.args.hidden_size, heads=model.args.num_attention_heads,
                                   kv_heads=model.args.num_key_value_heads, head_dim=model.args.head_dim)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        source = tokenizer_from / name
        if source.exists():
            (folder / name).write_text(source.read_text())
    return folder
