"""A local folder laid out like the Hugging Face hub cache, for tests without network.

Layout (as huggingface-hub writes it): models--org--name/blobs/<sha256> holds the
bytes, snapshots/<commit>/<file> are relative symlinks to the blobs, and
refs/main holds the commit hash. Point HF_HUB_CACHE at the root and set
HF_HUB_OFFLINE=1; mlxcore.hub reads both at call time.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_fake_hub(cache: Path, repo_id: str, source: Path, commit: str = FAKE_COMMIT) -> Path:
    """Put the files of the folder ``source`` into ``cache`` as repo ``repo_id``; return the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in source.iterdir() if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
