"""Command-line options shared by `mlxchat`, `mlxchat ask`, `mlxchat serve` and `mlxchat models`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from app.catalog import Catalog
from mlxcore import GenerationParams, KVConfig, ModelChoice, UsageError
from mlxcore import KVLimit, local_model, parse_max_kv
from mlxcore import LOOKUP, SUPPORTED_BITS


MODELS_DIR_ENV = "MLXCHAT_MODELS_DIR"  # --models-dir's default


def add_models_dir_option(group: argparse._ActionsContainer) -> None:
    group.add_argument("--models-dir", metavar="DIR", type=Path, default=os.environ.get(MODELS_DIR_ENV) or None,
                       help="a folder of model folders (config.json and model*.safetensors each): --model names "
                            f"them by their folder's name (default: ${MODELS_DIR_ENV}, if set)")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", metavar="REF",
                       help="a model `mlxchat models` lists (a --models-dir folder's name, a cached hub repo), "
                            "hub repo id (org/name), local MLX folder, or embedded name (mini-target); "
                            "default: a 4-bit Qwen3 from the hub, or the embedded demo model offline")
    add_models_dir_option(group)
    group.add_argument("--draft", metavar="REF", help="draft model for speculative decoding (same tokenizer), a "
                       "block drafter folder (DFlash layout, made for this model), or "
                       "'lookup': draft only from the reply's own text, no model (pays where replies repeat "
                       "their context: edits, quotes). Lookup is on by default: beside a drafter, or alone")
    group.add_argument("--no-draft", action="store_true", help="decode without a draft model or prompt lookup")
    group.add_argument("--num-draft", type=int, default=8, metavar="K",
                       help="most tokens the draft proposes per round (adaptive below that; default 8)")
    group.add_argument("--kv", choices=("paged", "rotating", "standard"), default="paged",
                       help="KV cache: paged (default; shares prefixes), rotating (fixed window), "
                            "standard (mlx-lm's)")
    group.add_argument("--max-kv", metavar="TOKENS|SIZE",
                       help="rotating: window in tokens; paged: most KV memory, as tokens per model (65536) or "
                            "a size shared by the model and its draft (8GB, 512MB, 1.5GiB); default: what the "
                            "machine has free")
    group.add_argument("--block-size", type=int, default=16, metavar="TOKENS", help="paged: tokens per block")
    group.add_argument("--kv-bits", type=int, default=None, metavar="8",
                       help="keep keys and values in 8 bits (paged or rotating): a third to a half of the float "
                            "cache's memory and session file size, answers nearly unchanged (see docs/decisions.md)")
    group.add_argument("--disk-kv", metavar="SIZE",
                       help="paged: most disk space for KV blocks that leave memory, read back instead of "
                            "computed again after an eviction, a model switch or a restart (20GB, 512MB; 0 turns "
                            "it off; default: a tenth of the free space, at most 32 GiB)")


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "generation", "Sampling defaults come from the model's generation_config.json (Qwen3: temperature 0.6, "
                      "top-p 0.95, top-k 20), else from mlxchat (greedy). With --session, a saved chat keeps its "
                      "own settings. The options given here override both.")
    group.add_argument("--system", metavar="TEXT", help="system prompt")
    group.add_argument("--temp", type=float, help="temperature; 0 = greedy (default: the model's, else 0)")
    group.add_argument("--top-p", type=float, help="nucleus sampling threshold (default: the model's, else 1 = off)")
    group.add_argument("--top-k", type=int, help="keep only the k likeliest tokens (default: the model's, else 0 = off)")
    group.add_argument("--min-p", type=float,
                       help="drop tokens below min-p x the top one (default: the model's, else 0 = off)")
    group.add_argument("--max-tokens", type=int,
                       help="longest reply in tokens (default: until the context is full; Esc or ctrl+c stops)")
    group.add_argument("--seed", type=int, help="random seed, for reproducible sampling")
    group.add_argument("--think", dest="think", action="store_true", default=None,
                       help="let the model think before it answers (default)")
    group.add_argument("--no-think", dest="think", action="store_false", default=None,
                       help="answer without thinking")


TEXT_OPTIONS = {"prompt": "The prompt", "system": "--system", "title": "The title", "search": "The search text"}


def utf8_text(text: str, what: str) -> str:
    """``text`` if it came from valid UTF-8; else UsageError. Python turns bytes that are not UTF-8 (in argv, or
    stdin read leniently) into lone surrogates, which the tokenizer and the session files cannot take."""
    bad = next((c for c in text if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        byte = f" (byte 0x{ord(bad) - 0xdc00:02x} is not UTF-8)" if "\udc80" <= bad <= "\udcff" else ""
        raise UsageError(f"{what} is not UTF-8 text{byte}: convert it first, e.g. with iconv -f latin1 -t utf-8.")
    return text


def check_text_options(args: argparse.Namespace) -> None:
    """Every free-text argument given must be UTF-8 text (see ``utf8_text``)."""
    for name, what in TEXT_OPTIONS.items():
        value = getattr(args, name, None)
        if isinstance(value, str):
            utf8_text(value, what)


def session_path(text: str) -> Path:
    """``--session FILE`` as a file a session can be saved to; UsageError for a folder or a missing folder."""
    path = Path(text)
    if path.is_dir() or path.name in ("", ".", ".."):
        raise UsageError(f"--session {text}: that is a folder, not a session file: give a file name, "
                         f"e.g. {path / 'chat.mlxchat'}.")
    folder = Path(os.path.realpath(path)).parent  # a symlink's target is what gets saved
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--session {text}: {folder} is a file, not a folder: save elsewhere.")
    if not folder.is_dir():
        raise UsageError(f"--session {text}: its folder {folder} does not exist: create it first, or save elsewhere.")
    return path


def models_dir(args: argparse.Namespace) -> Path | None:
    """``--models-dir`` (or its default from the environment); UsageError when it is not a folder."""
    folder = getattr(args, "models_dir", None)
    if folder is not None and not folder.is_dir():
        raise UsageError(f"--models-dir {folder} is not a folder.")
    return folder


def model_catalog(folder: Path | None) -> Catalog:
    """The models ``--model`` names: the folders under ``folder`` (``--models-dir``), then the hub cache's
    repos. A cached repo resolves to its repo id, as one not listed does: it loads from the cache, and offline
    too, as before (serve's requests, which may not download unless allowed, use a catalog of their own)."""
    return Catalog(None, folder, allow_download=True)


def model_choice(args: argparse.Namespace) -> ModelChoice:
    """The one place ``--model`` is resolved: a name the catalog lists loads that entry; anything else (a hub
    repo id, a folder, an embedded name) goes on as given. ``--draft`` and ``--no-draft`` stay as given."""
    model = args.model
    if model is not None and (entry := model_catalog(models_dir(args)).find(model)) is not None:
        model = entry.choice.model
    for ref in (model, None if args.no_draft or args.draft == LOOKUP else args.draft):
        if ref is not None:
            local_model(ref)  # a mistyped name or path is told now, before any model code loads
    return ModelChoice(model=model, draft=args.draft, no_draft=args.no_draft)


def kv_config(args: argparse.Namespace) -> KVConfig:
    """The KV config the options ask for; UsageError when they don't fit."""
    try:
        limit = parse_max_kv(args.max_kv) if args.max_kv is not None else KVLimit()
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.kv == "rotating" and limit.bytes is not None:
        raise UsageError(f"--kv rotating keeps a window of tokens: give --max-kv as a number of tokens "
                         f"(e.g. 4096), not {args.max_kv!r}.")
    max_kv = limit.tokens
    if args.kv == "rotating" and max_kv is None:
        max_kv = 4096  # a window that holds a long chat and stays small
    try:
        bits = getattr(args, "kv_bits", None)
        if bits is not None and bits not in SUPPORTED_BITS:
            raise UsageError(f"--kv-bits {bits}: only 8 is offered (4 bits did not keep answers close enough "
                             "to the float cache's; see docs/decisions.md, Quantized KV).")
        disk_bytes, disk_dir = disk_kv(args)
        return KVConfig(kind=args.kv, max_kv=max_kv, block_size=args.block_size, max_kv_bytes=limit.bytes,
                        kv_bits=bits, disk_kv_bytes=disk_bytes, disk_kv_dir=disk_dir)
    except ValueError as error:
        raise UsageError(str(error)) from None


def disk_kv_folder() -> Path:
    """Where the KV disk tier lives: beside the session store (``$MLXCHAT_HOME/kv-disk`` when set)."""
    from sessions import default_root
    return default_root().parent / "kv-disk"


def disk_kv(args: argparse.Namespace) -> tuple[int, str | None]:
    """The disk tier's budget in bytes (0: off) and folder, from ``--disk-kv``; UsageError when it is no size."""
    text = getattr(args, "disk_kv", None)
    if getattr(args, "kv", "paged") != "paged" or (text is not None and text.strip() == "0"):
        return 0, None
    from mlxcore import default_disk_budget
    folder = disk_kv_folder()
    if text is None:
        return default_disk_budget(folder), str(folder)
    try:
        size = parse_max_kv(text).bytes
    except ValueError:
        size = None
    if size is None:
        raise UsageError(f"--disk-kv {text!r}: give a size such as 20GB or 512MB, or 0 to turn the disk tier off.")
    return size, str(folder)


_PARAM_OPTIONS = {"temp": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                  "max_tokens": "max_tokens", "seed": "seed"}  # option dest -> GenerationParams field


def given_params(args: argparse.Namespace) -> dict[str, float | int]:
    """The generation parameters given on the command line (GenerationParams field -> value)."""
    return {name: getattr(args, dest) for dest, name in _PARAM_OPTIONS.items() if getattr(args, dest) is not None}


def generation_params(args: argparse.Namespace, base: GenerationParams | None = None) -> GenerationParams:
    """``base`` (default: the defaults) with the options given; UsageError when they don't fit."""
    try:
        return (base or GenerationParams()).replaced(given_params(args))
    except ValueError as error:
        raise UsageError(str(error)) from None
