"""Export trained checkpoints to the MLX layout with mlx-lm's own converter."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

# Files each exported folder keeps: weights and config from mlx-lm, tokenizer files from the recipe.
KEEP = {"config.json", "model.safetensors", "model.safetensors.index.json"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def export(hf_dir: Path, out: Path, tokenizer_dir: Path, quantize: bool = False) -> None:
    """Convert ``hf_dir`` to ``out`` (float32, or 4-bit affine with group size 64)."""
    convert = importlib.import_module("mlx_lm.convert").convert  # the module shadows its function
    if out.exists():
        shutil.rmtree(out)
    if quantize:
        convert(str(hf_dir), str(out), quantize=True, q_bits=4, q_group_size=64, dtype="float32")
    else:
        convert(str(hf_dir), str(out), dtype="float32")
    for path in out.iterdir():
        if path.name not in KEEP:
            path.unlink()
    for name in TOKENIZER_FILES:  # identical tokenizer files in every folder
        shutil.copyfile(tokenizer_dir / name, out / name)
    _check_config(out / "config.json")


def _check_config(path: Path) -> None:
    config = json.loads(path.read_text())
    if config.get("model_type") != "qwen3" or config.get("eos_token_id") != 2:
        raise RuntimeError(f"{path} lost its model type or eos token id: {config}")
