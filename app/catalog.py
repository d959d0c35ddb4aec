"""The models that load by name, for `serve`'s requests, `--model` and the window's model switch: the one
started with (serve's), folders under ``--models-dir``, and the snapshots in the Hugging Face cache
(``huggingface_hub.scan_cache_dir``). The embedded models are demos and tests' models: one is served when
the server starts with it, and the others are not offered (a client's model menu would list them beside the
user's own); a ``--models-dir`` may hold them. ``embedded_entries`` lists them for `mlxchat models` and the
window, which name them too.

Read from the disk on every call (cheap: directory listings), so a model copied in while the server
runs is found. Clients name models; they never give paths: only what is listed here loads, and a
repo id that is not cached only with ``--allow-download``.

MLX-free: the window's process lists models with it (tests/test_models_by_name.py checks), so it takes hub
names and the cache folder from ``mlxcore.hub_names``, not ``mlxcore.hub`` or ``mlxcore.loading`` (mlx_lm).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from assets import MODELS_DIR, embedded_names
from mlxcore import ModelChoice
from mlxcore import WEIGHTS_GLOB
from mlxcore import hub_cache_dir, is_repo_id


@dataclass(frozen=True)
class ModelEntry:
    """One model a request may name."""

    id: str  # the name clients send as "model"
    choice: ModelChoice  # what open_engine loads for it (local files, unless downloads are allowed)
    source: str  # "started", "models-dir", "hf-cache", "hub" (a download) or "embedded", for /v1/models
    folder: Path | None = None  # where its files are (None: not on this disk yet, or not known), for listings


def is_model_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob(WEIGHTS_GLOB))


def embedded_entries() -> list[ModelEntry]:
    """The models that ship in assets/models, each by its name."""
    return [ModelEntry(name, ModelChoice(model=name), "embedded", MODELS_DIR / name) for name in embedded_names()]


class Catalog:
    """See the module docstring. ``started`` is serve's first model (None for ask and the window).
    ``allow_download``: a repo id names its hub repo, cached or not, and a cached one loads by its repo id
    (huggingface_hub fetches what is newer when online); else a cached one loads from its snapshot folder."""

    def __init__(self, started: ModelEntry | None, models_dir: Path | None = None,
                 allow_download: bool = False) -> None:
        self.started = started
        self.models_dir = models_dir
        self.allow_download = allow_download

    def entries(self) -> list[ModelEntry]:
        """Every model that loads by name, each id once (the first source wins, in the order above)."""
        found: dict[str, ModelEntry] = {self.started.id: self.started} if self.started else {}
        for entry in (*self._folders(), *self._hub_cache()):
            found.setdefault(entry.id, entry)
        return list(found.values())

    def listing(self) -> list[ModelEntry]:
        """What ``--model`` names load (`mlxchat models`, the window's F5): ``entries()``, then the embedded
        models that none of them hides."""
        entries = self.entries()
        listed = {entry.id for entry in entries}
        return entries + [entry for entry in embedded_entries() if entry.id not in listed]

    def find(self, name: str) -> ModelEntry | None:
        """The entry for ``name``; None when nothing by that name loads here."""
        for entry in self.entries():
            if entry.id == name:
                return entry
        if self.allow_download and is_repo_id(name):
            return ModelEntry(name, ModelChoice(model=name, no_draft=True), "hub")
        return None

    def _folders(self) -> list[ModelEntry]:
        if self.models_dir is None or not self.models_dir.is_dir():
            return []
        return [ModelEntry(folder.name, ModelChoice(model=str(folder), no_draft=True), "models-dir", folder)
                for folder in sorted(self.models_dir.iterdir()) if is_model_folder(folder)]

    def _hub_cache(self) -> list[ModelEntry]:
        """Complete model snapshots in the hub cache, the newest of each repo."""
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
        try:
            repos = scan_cache_dir(hub_cache_dir()).repos
        except CacheNotFound:
            return []
        found = []
        for repo in sorted(repos, key=lambda r: r.repo_id):
            snapshots = sorted((r for r in repo.revisions if is_model_folder(r.snapshot_path)),
                               key=lambda r: r.last_modified, reverse=True)
            if repo.repo_type == "model" and snapshots:
                folder = snapshots[0].snapshot_path
                ref = repo.repo_id if self.allow_download else str(folder)
                found.append(ModelEntry(repo.repo_id, ModelChoice(model=ref, no_draft=True), "hf-cache", folder))
        return found
