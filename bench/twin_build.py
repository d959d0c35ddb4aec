"""Write a twin's files: seeded random weights, saved and quantized by mlx-lm's own functions.

The 4-bit twin is the float32 twin of the same seed cast to bfloat16 and
quantized the way ``mlx_lm.convert`` does it, so its scales and biases are
bfloat16 like the real repos'.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.models import qwen3, qwen3_5
from mlx_lm.utils import quantize_model, save_config, save_model

from assets import QWEN3_TOKENIZER_DIR
from bench.twin_specs import GROUP_SIZE, TwinSpec, generation_config, twin_config

RECIPE_VERSION = 1  # bump when the weights made for a given seed change: cached twins are rebuilt
LOGIT_STD = 4.0  # std of random logits: at 151,936 tokens a std of ~1 is nearly uniform, 4 is peaked
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def random_model(spec: TwinSpec, *, seed: int, vocab_pad: int = 0) -> nn.Module:
    """A float32 mlx-lm Qwen3 (Qwen3.5 for a hybrid spec) of shape ``spec`` whose weights depend on ``seed``
    only (still lazy)."""
    config = twin_config(spec, bits=None, vocab_pad=vocab_pad)
    family = qwen3_5 if spec.linear is not None else qwen3
    model = family.Model(family.ModelArgs.from_dict(config))  # its own random init is lazy, never computed
    params = tree_flatten(model.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    weights = [(name, _random_weight(name, value.shape, key, spec.hidden_size))
               for (name, value), key in zip(params, keys)]
    model.update(tree_unflatten(weights))
    return model


def _random_weight(name: str, shape: tuple[int, ...], key: mx.array, hidden: int) -> mx.array:
    if len(shape) == 1:
        return mx.ones(shape)  # RMSNorm scales, as a fresh model has them
    if "embed_tokens" in name or "lm_head" in name:
        # Output rows (also the input rows when tied): the final RMSNorm gives unit-RMS features,
        # so this std over ``hidden`` of them makes logits of std LOGIT_STD.
        std = LOGIT_STD / hidden**0.5
    else:
        std = shape[-1] ** -0.5  # keeps each projection's output near unit RMS
    return mx.random.normal(shape, key=key) * std


def quantize_bf16(model: nn.Module, config: dict[str, Any], bits: int) -> dict[str, Any]:
    """Cast ``model`` to bfloat16 and quantize it in place as mlx_lm.convert does; the new config."""
    model.update(tree_map(lambda p: p.astype(mx.bfloat16), model.parameters()))
    with contextlib.redirect_stdout(io.StringIO()):  # it prints bits per weight; our CLI's stdout is a path
        _, config = quantize_model(model, config, GROUP_SIZE, bits)
    # The users' repos were converted before mlx-lm wrote "mode"; without it, loading means affine.
    config["quantization"] = {k: v for k, v in config["quantization"].items() if k != "mode"}
    return config


def write_twin(folder: Path, spec: TwinSpec, *, bits: int | None, seed: int, vocab_pad: int = 0) -> None:
    """Write a complete twin into ``folder`` (created): weights, index, configs, Qwen3's tokenizer."""
    model = random_model(spec, seed=seed, vocab_pad=vocab_pad)
    config = twin_config(spec, bits=bits, vocab_pad=vocab_pad)
    if bits is not None:
        config = quantize_bf16(model, config, bits)
    save_folder(folder, model, config)


def save_folder(folder: Path, model: nn.Module, config: dict[str, Any]) -> None:
    """Write ``model`` with ``config`` into ``folder`` (created) in the mlx-community layout, with Qwen3's own
    tokenizer and generation config."""
    save_model(folder, model, donate_model=True)
    save_config(config, folder / "config.json")
    (folder / "generation_config.json").write_text(json.dumps(generation_config(), indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(QWEN3_TOKENIZER_DIR / name, folder / name)
