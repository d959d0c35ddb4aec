"""A folder whose writes can be made to fail as on a full disk, for the disk-full fault tests.

``tmpfs``: a 4 MB tmpfs mounted by the test (needs root and a ``mount`` that works);
``fill()`` takes its free space with a filler file, ``free()`` gives it back.
``rlimit``: an ordinary folder; ``fill()`` caps the size of any file a child process
started with ``preexec`` writes (RLIMIT_FSIZE) at the largest file already there, so
a session file cannot grow.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

TMPFS_BYTES = 4 << 20  # a few saves of a short chat on the embedded pair (~0.5 MB each, twice while replacing)


def can_mount() -> bool:
    return os.name == "posix" and os.geteuid() == 0 and shutil.which("mount") is not None


class SmallDisk:
    def __init__(self, folder: Path, kind: str) -> None:
        self.folder, self.kind = folder, kind
        self.limit: int | None = None
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "tmpfs":
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(folder)],
                                     capture_output=True, text=True)
            if mounted.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    @property
    def filler(self) -> Path:
        return self.folder / "filler"

    def fill(self) -> None:
        if self.kind == "rlimit":
            self.limit = max(p.stat().st_size for p in self.folder.iterdir())
            return
        try:
            with open(self.filler, "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass  # full

    def free(self) -> None:
        self.limit = None
        self.filler.unlink(missing_ok=True)

    def preexec(self) -> None:
        """For subprocess.Popen(preexec_fn=...): the child cannot write a file larger than the limit."""
        if self.limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, resource.RLIM_INFINITY))

    def close(self) -> None:
        if self.kind == "tmpfs":
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)


@pytest.fixture(params=["tmpfs", "rlimit"])
def small_disk(request, tmp_path):
    if request.param == "tmpfs" and not can_mount():
        pytest.skip("mounting a tmpfs needs root")
    disk = SmallDisk(tmp_path / "disk", request.param)
    yield disk
    disk.close()
