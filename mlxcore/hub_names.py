"""Model references, hub repo names, the offline switches and the hub cache folder: what needs no download
and no MLX.

Split from ``mlxcore.hub`` (which imports mlx_lm) so that the window's process, which must not load MLX,
can list and resolve models (``app.catalog``), and a mistyped ``--model`` is told before any model code
loads. Read on every call, as ``mlxcore.hub`` says why.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from assets import MODELS_DIR, embedded_names
from mlxcore.errors import ModelLoadError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_TRUE = {"1", "true", "yes", "on"}


def is_repo_id(ref: str) -> bool:
    """Whether ``ref`` has the shape of a hub repo id, "org/name"."""
    return bool(REPO_ID.match(ref)) and ".." not in ref


def local_model(ref: str) -> tuple[Path, str] | None:
    """(folder, display name) of the embedded model or the folder ``ref`` names; None for a hub repo id (found
    in the hub cache or downloaded: ``mlxcore.hub``); ``ModelLoadError`` when it is none of these."""
    if not ref.strip():
        raise ModelLoadError("No model given; name an embedded model, a folder or a hub repo.")
    if ref in embedded_names(drafters=True):
        return MODELS_DIR / ref, ref
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file; give the folder that holds config.json.")
        return path.resolve(), path.resolve().name
    if is_repo_id(ref):
        return None
    if any(sep in ref for sep in "/\\~") or ref.startswith("."):
        raise ModelLoadError(f"There is no folder {path}; check the path.")
    names = ", ".join(embedded_names()) or "none installed"
    raise ModelLoadError(f"Unknown model {ref!r}: not an embedded model ({names}), a folder "
                         "or a hub repo id like mlx-community/Qwen3-0.6B-4bit.")


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to a true value ("1", "true", ...)."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def offline_by_env() -> bool:
    """Whether the environment forbids network access: HF_HUB_OFFLINE or MLXCHAT_OFFLINE."""
    return env_flag("HF_HUB_OFFLINE") or env_flag("TRANSFORMERS_OFFLINE") or env_flag("MLXCHAT_OFFLINE")


def hub_cache_dir() -> Path:
    """The hub cache folder as the environment says now (HF_HUB_CACHE, then HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)
