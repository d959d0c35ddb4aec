"""Hub repo names, the offline switches and the hub cache folder: what needs no download and no MLX.

Split from ``mlxcore.hub`` (which imports mlx_lm) so that the window's process, which must not load MLX,
can list and resolve models (``app.catalog``). Read on every call, as ``mlxcore.hub`` says why.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_TRUE = {"1", "true", "yes", "on"}


def is_repo_id(ref: str) -> bool:
    """Whether ``ref`` has the shape of a hub repo id, "org/name"."""
    return bool(REPO_ID.match(ref)) and ".." not in ref


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
