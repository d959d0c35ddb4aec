"""The models that load by name, for `serve`'s requests, `--model` and the window's model switch: the one
started with, folders under ``--models-dir``, and the snapshots in the Hugging Face cache
(``huggingface_hub.scan_cache_dir``). The embedded models are demos and tests' models: one is served when
the server starts with it, and the others are not offered (a client's model menu would list them beside the
user's own); a ``--models-dir`` may hold them.

Read from the disk on every call (cheap: directory listings), so a model copied in while the server
runs is found. Clients name models; they never give paths: only what is listed here loads, and a
repo id that is not cached only with ``--allow-download``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxcore.configs import ModelChoice

WEIGHTS_GLOB = "model*.safetensors"  # mlxcore.fingerprint's (not imported: it stays MLX-free here)


@dataclass(frozen=True)
class ModelEntry:
    """One model a request may name."""

    id: str  # the name clients send as "model"
    choice: ModelChoice  # what open_engine loads for it (local files, unless downloads are allowed)
    source: str  # "started", "models-dir", "hf-cache" or "hub" (a download), for /v1/models


def is_model_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob(WEIGHTS_GLOB))


class Catalog:
    """See the module docstring."""

    def __init__(self, started: ModelEntry, models_dir: Path | None = None, allow_download: bool = False) -> None:
        self.started = started
        self.models_dir = models_dir
        self.allow_download = allow_download

    def entries(self) -> list[ModelEntry]:
        """Every model that loads by name, each id once (the first source wins, in the order above)."""
        found: dict[str, ModelEntry] = {self.started.id: self.started}
        for entry in (*self._folders(), *self._hub_cache()):
            found.setdefault(entry.id, entry)
        return list(found.values())

    def find(self, name: str) -> ModelEntry | None:
        """The entry for ``name``; None when nothing by that name loads here."""
        for entry in self.entries():
            if entry.id == name:
                return entry
        from mlxcore.hub import is_repo_id
        if self.allow_download and is_repo_id(name):
            return ModelEntry(name, ModelChoice(model=name, no_draft=True), "hub")
        return None

    def _folders(self) -> list[ModelEntry]:
        if self.models_dir is None or not self.models_dir.is_dir():
            return []
        return [ModelEntry(folder.name, ModelChoice(model=str(folder), no_draft=True), "models-dir")
                for folder in sorted(self.models_dir.iterdir()) if is_model_folder(folder)]

    def _hub_cache(self) -> list[ModelEntry]:
        """Complete model snapshots in the hub cache, loaded from their folder (no network) unless downloads
        are allowed, when the repo id lets huggingface_hub fetch what is newer."""
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound

        from mlxcore.hub import hub_cache_dir
        try:
            repos = scan_cache_dir(hub_cache_dir()).repos
        except CacheNotFound:
            return []
        found = []
        for repo in sorted(repos, key=lambda r: r.repo_id):
            snapshots = sorted((r for r in repo.revisions if is_model_folder(r.snapshot_path)),
                               key=lambda r: r.last_modified, reverse=True)
            if repo.repo_type == "model" and snapshots:
                ref = repo.repo_id if self.allow_download else str(snapshots[0].snapshot_path)
                found.append(ModelEntry(repo.repo_id, ModelChoice(model=ref, no_draft=True), "hf-cache"))
        return found
