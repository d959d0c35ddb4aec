"""Load a model and its tokenizer from an embedded name, a local folder or a hub repo.

mlx-lm builds the model and the tokenizer; this module finds the folder, checks
it first so that broken files give one clear ModelLoadError instead of a
traceback from json, safetensors or mlx, and computes the fingerprint.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import MODEL_REMAPPING
from mlx_lm.utils import load_model as mlx_lm_load_model
from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

from mlxcore.compiled_forward import SPLIT_MODEL_TYPES
from mlxcore.distributed.shard_check import check_shardable
from mlxcore.distributed.world import SINGLE, World
from mlxcore.errors import ModelLoadError, TokenizerMismatchError
from mlxcore.fingerprint import model_fingerprint, one_line, read_config
from mlxcore.generation_config import read_generation_defaults
from mlxcore.hub import Progress, download
from mlxcore.hub_names import local_model
from mlxcore.memory_fit import folder_weights
from mlxcore.out_of_memory import is_out_of_memory, not_enough_memory

_TOO_LONG_WARNING = "sequence-length-is-longer-than-the-specified-maximum"  # transformers' key for it

# mlx-lm's models whose linear-attention layers carry a recurrent state (kv/hybrid.py), on one sequence for now
HYBRID_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run, with what identifies it."""

    model: nn.Module  # mlx-lm model: model(ids[None], cache=caches) -> logits
    tokenizer: TokenizerWrapper  # mlx-lm's wrapper: encode, decode, chat template, eos_token_ids
    fingerprint: str  # see mlxcore.fingerprint; session files record it
    path: Path  # the folder the files were read from
    config: dict[str, object]  # config.json as mlx-lm completed it (quantization, eos ids)
    name: str  # for display: the embedded name, the repo id or the folder name
    generation_defaults: dict[str, float] = field(default_factory=dict)  # its generation_config.json's sampling


@dataclass(frozen=True)
class ModelFiles:
    """A model's folder, found and checked, its weights not read yet."""

    folder: Path
    name: str  # for display: the embedded name, the repo id or the folder name
    fingerprint: str
    config: dict[str, object]  # config.json as written


def load_model(ref: str) -> LoadedModel:
    """Load the model ``ref``: an embedded name, a local MLX folder, or a hub repo "org/name" (downloaded when
    not cached, with a bar on stderr); ModelLoadError in one line for anything missing, unreadable or
    inconsistent."""
    return load_found(find_model(ref))


def find_model(ref: str, *, progress: Progress | None = None) -> ModelFiles:
    """Find (or download) ``ref`` and check its files, without reading the weights."""
    folder, name = resolve(ref, progress=progress)
    fingerprint = model_fingerprint(folder)  # also checks config.json and the safetensors headers
    config = read_config(folder)
    _check_config(folder, config)
    return ModelFiles(folder, name, fingerprint, config)


def load_found(files: ModelFiles, *, world: World = SINGLE) -> LoadedModel:
    """Build the model in ``files``; over several ranks (``world``), only this rank's share of it
    (mlx-lm's tensor-parallel ``shard()``; ``ShardingError`` before any weight is read if it does not split)."""
    if world.distributed:
        check_shardable(files.config, world.size, files.folder)
    model, config = _build_model(files.folder, files.name, world)
    tokenizer = _load_tokenizer(files.folder, config)
    return LoadedModel(model, tokenizer, files.fingerprint, files.folder, config, files.name,
                       read_generation_defaults(files.folder))


def resolve(ref: str, *, progress: Progress | None = None) -> tuple[Path, str]:
    """(local folder, display name) for ``ref``: embedded name, then existing path, then repo id."""
    return local_model(ref) or (download(ref, progress=progress), ref)


def check_draft_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise TokenizerMismatchError unless ``draft`` shares ``target``'s vocabulary and end tokens.
    The embedding shapes may differ (padding rows); only the tokenizers are compared."""
    vocab_t, vocab_d = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if vocab_t != vocab_d:
        raise TokenizerMismatchError(
            f"The draft {draft.name} cannot speed up {target.name}: their tokenizers differ "
            f"({_vocab_difference(vocab_t, vocab_d)}); pick a draft from the same model family, "
            "or run without a draft.")
    eos_t, eos_d = set(target.tokenizer.eos_token_ids), set(draft.tokenizer.eos_token_ids)
    if eos_t != eos_d:
        raise TokenizerMismatchError(
            f"The draft {draft.name} cannot speed up {target.name}: their end-of-text token ids differ "
            f"({sorted(eos_t)} vs {sorted(eos_d)}); pick a draft from the same model family, "
            "or run without a draft.")


def _vocab_difference(target: dict[str, int], draft: dict[str, int]) -> str:
    if len(target) != len(draft):
        return f"{len(target)} tokens vs {len(draft)}"
    changed = sorted(token for token, id_ in target.items() if draft.get(token) != id_)
    example = changed[0]
    return (f"{len(changed)} of {len(target)} tokens differ, e.g. {example!r} is "
            f"{target[example]} in the target and {draft.get(example, 'missing')} in the draft")


def _check_config(folder: Path, config: dict[str, object]) -> None:
    """Fail early, with a clear message, on a config.json mlx-lm cannot build a model from."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelLoadError(f"{folder / 'config.json'} has no model_type; "
                             "restore it or download the model again.")
    module_name = f"mlx_lm.models.{MODEL_REMAPPING.get(model_type, model_type)}"
    if importlib.util.find_spec(module_name) is None:
        raise ModelLoadError(f"model_type {model_type!r} in {folder / 'config.json'} is not supported "
                             "by the installed mlx-lm; use a Qwen3 model.")
    if model_type not in SPLIT_MODEL_TYPES + HYBRID_MODEL_TYPES:
        raise ModelLoadError(f"{folder} is a {model_type} model; mlxchat runs Qwen3, Qwen3-MoE, Qwen3.5 and "
                             "Qwen3-Next models.")
    try:
        importlib.import_module(module_name).ModelArgs.from_dict(config)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise ModelLoadError(f"{folder / 'config.json'} does not describe a {model_type} model "
                             f"({one_line(error)}); restore it or download the model again.") from error


def _build_model(folder: Path, name: str, world: World) -> tuple[nn.Module, dict[str, object]]:
    try:
        if not world.distributed:
            model, config = mlx_lm_load_model(folder)
        else:
            model, config = mlx_lm_load_model(folder, lazy=True)  # only this rank's slices are read
            model.shard(world.group)
            mx.eval(model.parameters())
        # Qwen3.5's checkpoints wrap the language model in a vision-language one; the text model is what runs.
        text_model = getattr(model, "language_model", model)
        return (text_model if isinstance(text_model, nn.Module) else model), config
    except (ValueError, TypeError, KeyError, RuntimeError, OSError, MemoryError) as error:
        if is_out_of_memory(error):  # the files are fine: downloading them again would not help
            raise ModelLoadError(not_enough_memory(name, folder_weights(folder))) from error
        raise ModelLoadError(f"The weights in {folder} do not fit its config.json or cannot be read "
                             f"({one_line(error)[:300]}); download the model again.") from error


def _load_tokenizer(folder: Path, config: dict[str, object]) -> TokenizerWrapper:
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.model").is_file():
        raise ModelLoadError(f"{folder} has no tokenizer (tokenizer.json); copy the tokenizer files "
                             "from the original model or download it again.")
    try:
        tokenizer: TokenizerWrapper = mlx_lm_load_tokenizer(folder, eos_token_ids=config.get("eos_token_id"))
    except (ValueError, TypeError, KeyError, OSError, AttributeError) as error:
        raise ModelLoadError(f"The tokenizer in {folder} cannot be read ({one_line(error)[:300]}); "
                             "copy it again from the original model.") from error
    given = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(given, dict):
        # transformers warns once per tokenizer about a text longer than the model's context; our own
        # message (Engine._check_prompt) says so and what to do, so mark its warning as given.
        given[_TOO_LONG_WARNING] = True
    return tokenizer
