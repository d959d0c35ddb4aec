"""Whether a model splits over N ranks, read from its config.json before any weights load."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from mlx_lm.utils import MODEL_REMAPPING

from mlxcore.distributed.errors import ShardingError

# config key -> what it is, for each width mlx-lm's shard() divides between ranks (KV heads first: the fewest)
SPLIT_WIDTHS = {"num_key_value_heads": "KV heads", "num_attention_heads": "attention heads",
                "intermediate_size": "MLP width", "moe_intermediate_size": "expert MLP width",
                "linear_num_key_heads": "linear key heads", "linear_num_value_heads": "linear value heads"}


def check_shardable(config: Mapping[str, object], ranks: int, where: Path | str) -> None:
    """``ShardingError`` unless mlx-lm can split this model (``shard()``) evenly over ``ranks``."""
    model_type = str(config.get("model_type", ""))
    text_config = config.get("text_config")
    config = {**(text_config if isinstance(text_config, Mapping) else {}), **config}  # Qwen3.5's checkpoints nest the text model's
    module = importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(model_type, model_type)}")
    if not hasattr(module.Model, "shard"):
        raise ShardingError(f"{where}: mlx-lm cannot split {model_type} models over several ranks "
                            "(it has no tensor-parallel shard() for them); run it on one machine.")
    for key, what in SPLIT_WIDTHS.items():
        width = _width(config, key)
        if width is not None and width % ranks:
            raise ShardingError(f"{where} has {width} {what}, which {ranks} ranks cannot share evenly: run it on "
                                f"a number of ranks that divides {width} (e.g. {_divisor_below(width, ranks)}).")
    quantization = config.get("quantization")
    group = _width(quantization, "group_size") if isinstance(quantization, dict) else None
    if group:  # a quantized layer split on its input side keeps whole quantization groups on each rank
        for what, width in _input_split_widths(config).items():
            if width is not None and (width // ranks) % group:
                raise ShardingError(f"{where}: its {what} ({width}) split over {ranks} ranks leaves {width // ranks} "
                                    f"columns per rank, not whole groups of {group} quantized weights; run it on "
                                    "fewer ranks.")


def _input_split_widths(config: Mapping[str, object]) -> dict[str, int | None]:
    """The widths ``shard()`` splits on a layer's input side (o_proj, down_proj, the experts' down_proj)."""
    heads = _width(config, "num_attention_heads") or 1
    head_dim = _width(config, "head_dim") or (_width(config, "hidden_size") or 0) // heads
    return {"attention output": heads * head_dim, "MLP width": _width(config, "intermediate_size"),
            "expert MLP width": _width(config, "moe_intermediate_size")}


def _width(config: Mapping[str, object], key: str) -> int | None:
    value = config.get(key)
    if value is None and key == "num_key_value_heads":
        value = config.get("num_attention_heads")
    return int(value) if isinstance(value, (int, float)) else None


def _divisor_below(width: int, ranks: int) -> int:
    return max(d for d in range(1, ranks + 1) if width % d == 0)
