"""Random-weight block drafters in DFlash's published layout (z-lab's ``*-DFlash-*`` folders), for a target.

The folder is what z-lab's torch export writes: ``config.json`` (Qwen3's layer fields, ``architectures``
``DFlashDraftModel``, ``block_size``, ``num_target_layers``, ``dflash_config`` with ``target_layer_ids`` and
``mask_token_id``) and ``model.safetensors`` in bfloat16 with the torch module's names (``fc.weight``,
``hidden_norm.weight``, ``layers.N.self_attn.q_proj.weight``, ..., ``norm.weight``), no embedding or head.
``python -m bench.twin_block TARGET_FOLDER OUT`` writes one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcore.block_drafter import BlockDrafterConfig, BlockDraftModel

BLOCK_SIZE = 16  # z-lab's published drafters are b16


def spread_layers(target_layers: int, count: int) -> list[int]:
    """``count`` target layers to read, spread evenly from the second to the fourth from last (the middle one
    for a single layer), as z-lab's drafters pick them."""
    if count == 1:
        return [target_layers // 2]
    first, last = 1, max(target_layers - 3, 1)
    return [round(first + i * (last - first) / (count - 1)) for i in range(count)]


def block_config(target: dict[str, Any], *, layers: int = 1, block_size: int = BLOCK_SIZE,
                 target_layer_ids: list[int] | None = None, mask_token_id: int | None = None) -> dict[str, Any]:
    """A drafter's config.json for the target whose config.json is ``target``."""
    hidden, vocab, heads = target["hidden_size"], target["vocab_size"], target["num_attention_heads"]
    rope = target.get("rope_theta") or (target.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
    ids = target_layer_ids if target_layer_ids is not None else spread_layers(target["num_hidden_layers"], layers)
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False,
        "block_size": block_size, "num_target_layers": target["num_hidden_layers"],
        "dflash_config": {"mask_token_id": vocab - 1 if mask_token_id is None else mask_token_id,
                          "target_layer_ids": ids},
        "hidden_size": hidden, "intermediate_size": target["intermediate_size"], "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target.get("head_dim") or hidden // heads, "vocab_size": vocab,
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6), "rope_theta": rope, "rope_scaling": None,
        "max_position_embeddings": target.get("max_position_embeddings", 40_960),
        "layer_types": ["full_attention"] * layers, "tie_word_embeddings": False, "dtype": "bfloat16",
    }


def write_block_drafter(folder: Path, target: Path | dict[str, Any], *, seed: int = 0, **options: Any) -> Path:
    """Write a random-weight drafter for ``target`` (its folder, or its config.json as a dict) into ``folder``
    (created); ``options`` go to ``block_config``."""
    target_config = target if isinstance(target, dict) else json.loads((Path(target) / "config.json").read_text())
    config = block_config(target_config, **options)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    model = BlockDraftModel(BlockDrafterConfig.read(folder))
    params = tree_flatten(model.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    weights = {name: (mx.ones(value.shape) if value.ndim == 1 else mx.random.normal(value.shape, key=key)
                      * value.shape[-1] ** -0.5).astype(mx.bfloat16)
               for (name, value), key in zip(params, keys)}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "pt"})
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.twin_block",
                                     description="Write a random-weight block drafter (DFlash layout) for a target.")
    parser.add_argument("target", type=Path, help="the target's folder (its config.json)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_block_drafter(args.out, args.target, seed=args.seed, layers=args.layers))


if __name__ == "__main__":
    main()
