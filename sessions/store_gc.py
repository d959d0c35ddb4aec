"""Garbage collection of stored blocks: delete the block files no chat refers to, safely with other processes.

One ``flock`` on ``<store>/.blocks.lock`` orders it:

- A save holds it *shared* from the moment it looks which blocks exist until its
  index commit: a block it found (and so did not write) or wrote cannot vanish
  before the chat refers to it. A read of a chat's blocks (open, export) holds it
  shared too, so the blocks of the state it read stay until it read them.
- GC holds it *exclusively*, and never waits for it (a store busy saving is collected
  next time). With no save half way and no reader, a block that no committed chat
  refers to is garbage: the previous tail of a chat that grew, the reply a
  regeneration replaced, a deleted chat's blocks, or what a killed save left.

flock locks go with their process however it ends, so a crash never blocks GC.
Pure Python (no MLX).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sessions.block_files import BlockFiles
from sessions.errors import SessionFileError
from sessions.store_index import StoreIndex


class BlockLock:
    """The store's block lock (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.file = Path(root) / ".blocks.lock"

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held while saving or reading blocks; waits while a GC pass deletes (milliseconds)."""
        fd = self._open()
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            if fd is not None:
                os.close(fd)

    @contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Yields whether GC may run now (no save or read in progress anywhere); never waits."""
        fd = self._open()
        if fd is None:
            yield False  # a store nobody can write: nothing to collect either
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _open(self) -> int | None:
        """The lock file's descriptor; None for a store in a folder nobody can write (no lock file)."""
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            try:  # a read-only folder: reading its chats needs no lock, since no process can change them
                return os.open(self.file, os.O_RDONLY)
            except FileNotFoundError:
                return None
            except OSError:
                raise SessionFileError(f"Cannot open the session store's lock {self.file}: "
                                       f"{error.strerror or error}. Check that {self.file.parent} is writable.") \
                    from None


def collect(index: StoreIndex, candidates: Iterable[str] | None = None) -> int | None:
    """Delete the blocks among ``candidates`` (every stored block, when None) that no chat refers to.

    A full pass (None) also removes the temporary files killed saves left. Returns
    the number of files removed, or None when another process was saving or reading.
    """
    files = BlockFiles(index.root)
    with BlockLock(index.root).exclusive() as free:
        if not free:
            return None
        keys = set(files.keys()) if candidates is None else set(candidates)
        garbage = keys - index.referenced(keys if candidates is not None else None)
        removed = sum(files.remove(key) for key in sorted(garbage))
        if candidates is None:
            for temp in files.temporaries():  # under the exclusive lock no save is writing: a killed one's
                temp.unlink(missing_ok=True)
                removed += 1
    return removed
