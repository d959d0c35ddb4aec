"""Stored KV blocks as content-addressed files: ``<store>/blocks/<first two hex digits>/<key>``.

A block file is written once and never changed: to a temporary file, fsync, rename,
fsync of its folder. So a file that exists under a key is whole, and the index may
refer to it. Its bytes are a frame with a checksum (``mlxcore/kv/block_frame.py``: the
one block format, the pool's disk tier writes the same).

Why files rather than SQLite blobs: an autosave writes each new block once (a blob
goes to the WAL and again to the database at the checkpoint), and GC is an unlink.
The figures are in bench/studies/store_choices.py.

Pure Python (no MLX). Who may delete a block, and when, is store_gc.py's business.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from mlxcore import frame_block, unframe_block
from sessions.disk_sync import sync_to_disk
from sessions.errors import SessionFileError, SessionSaveError
from sessions.file_format import fsync_folder, write_error_text
from sessions.temp_files import temp_path

KEY = re.compile(r"[0-9a-f]{40}")


class BlockFileError(SessionFileError):
    """A stored block is missing or damaged (the message names it)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key  # the block's key, when it is a key


class BlockFiles:
    """The block files under ``root / "blocks"``."""

    def __init__(self, root: Path) -> None:
        self.folder = Path(root) / "blocks"

    def path(self, key: str) -> Path:
        if not KEY.fullmatch(key):  # keys come from the index: never let one name another path
            raise BlockFileError(f"{key!r} is not a block key: the session store's index is damaged.")
        return self.folder / key[:2] / key

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def write_many(self, blocks: Mapping[str, bytes]) -> int:
        """Write every (key, payload) durably; returns the bytes of the files written.

        Raises ``SessionSaveError`` (disk full, read-only, ...) after removing its temporary file;
        the blocks already written stay (unreferenced until an index commit refers to them).
        """
        written, folders = 0, set()
        for key, payload in blocks.items():
            path = self.path(key)
            folders.add(path.parent)
            written += self._write(path, payload)
        for folder in sorted(folders):  # the renames themselves durable before the index may refer to them
            fsync_folder(folder)
        return written

    def read(self, key: str) -> bytes:
        """The payload of block ``key``, its checksum verified; ``BlockFileError`` if missing or damaged."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlockFileError(f"The stored cache block {key} is missing.", key) from None
        except OSError as error:
            raise BlockFileError(f"Cannot read the stored cache block {path}: {error.strerror or error}.") from None
        payload = unframe_block(data)
        if payload is None:
            raise BlockFileError(f"The stored cache block {path} is damaged (truncated, or changed after it "
                                 "was written).", key)
        return payload

    def remove(self, key: str) -> bool:
        """Delete block ``key``; False when there was no such file."""
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def keys(self) -> Iterator[str]:
        """Every stored block's key (temporary files left out)."""
        for path in self._entries():
            if KEY.fullmatch(path.name):
                yield path.name

    def temporaries(self) -> Iterator[Path]:
        """Temporary files: each a write in progress, or one a killed process left."""
        return (path for path in self._entries() if path.name.endswith(".tmp"))

    def _entries(self) -> Iterator[Path]:
        if not self.folder.is_dir():
            return
        for sub in self.folder.iterdir():
            if sub.is_dir() and len(sub.name) == 2:
                yield from sub.iterdir()

    def _write(self, path: Path, payload: bytes) -> int:
        data = frame_block(payload)
        temp = temp_path(path)
        try:
            made = not path.parent.is_dir()
            path.parent.mkdir(parents=True, exist_ok=True)
            if made:
                fsync_folder(path.parent.parent)
            with open(temp, "wb") as out:
                out.write(data)
                out.flush()
                sync_to_disk(out.fileno())
            os.replace(temp, path)
        except OSError as error:
            _remove_quietly(temp)
            raise SessionSaveError(write_error_text(path.parent.parent.parent, error)) from error
        return len(data)


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only folder never had it

