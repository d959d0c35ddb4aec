"""The paged pool's second tier: KV blocks on disk, under a byte budget, least recently used out.

A full block that leaves memory (evicted, its model unloaded, the server stopping) is written here once,
under a key that names its model, KV format, block size and chained hash (``pool_disk.py``), and a prompt's
prefix lookup that misses in memory reads it back instead of computing it. One process-wide tier per folder,
shared by every pool of every model in the process (``open_disk_tier``).

Writes run on a thread of their own: the engine's thread hands over bytes and never waits for the disk.
Files, crash safety, the budget and a full disk: docs/kv-disk.md.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import shutil
import threading
from collections import OrderedDict
from contextlib import suppress
from pathlib import Path

from mlxcore.kv.block_frame import frame_block, unframe_block

log = logging.getLogger("mlxchat.kv")

DEFAULT_SHARE = 0.1  # the default budget: this share of the disk's free space ...
DEFAULT_CAP = 32 << 30  # ... but no more than this
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def default_disk_budget(root: Path) -> int:
    """The budget ``--disk-kv`` defaults to: a tenth of the free space where the tier lives, at most 32 GiB."""
    folder = Path(root)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return 0
    return int(min(free * DEFAULT_SHARE, DEFAULT_CAP))


class DiskTier:
    """Blocks on disk under ``root``, within ``limit`` bytes (see the module docstring)."""

    def __init__(self, root: Path, limit: int) -> None:
        self.folder, self.limit = Path(root) / "blocks", limit
        self._lock = threading.Lock()
        self._files: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recently used first
        self._queued: dict[str, bytes] = {}  # key -> payload handed over, not yet written (reads find it here)
        self.bytes = 0
        self.written = 0  # blocks written since the start (the bench reports them)
        self.hit_tokens = 0  # prompt tokens read back from here instead of computed, since the start
        self.stopped: str | None = None  # why writing stopped (a full disk), or None
        self._scan()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._write_loop, name="kv-disk-tier", daemon=True)
        self._thread.start()

    # the engine's thread ---------------------------------------------------

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._files or key in self._queued

    def put(self, key: str, payload: bytes) -> None:
        """Write ``payload`` under ``key`` in the background, unless it is there or queued already."""
        with self._lock:
            if self.stopped is not None or key in self._files or key in self._queued:
                return
            self._queued[key] = payload
        self._queue.put((key, payload))

    def read(self, key: str) -> bytes | None:
        """The payload under ``key``, or None: missing, or damaged (then the file goes). A block still waiting for
        the writer is read from memory (a model unloaded and loaded again at once finds its blocks)."""
        with self._lock:
            pending = self._queued.get(key)
        if pending is not None:
            return pending
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self._forget(key)
            return None
        payload = unframe_block(data)
        if payload is None:
            log.warning("a KV block on disk was damaged (%s): removed, its tokens are computed again", path.name)
            self._remove(key)
            return None
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
        with suppress(OSError):
            os.utime(path)  # its age orders the next process's evictions too
        return payload

    @property
    def blocks(self) -> int:
        with self._lock:
            return len(self._files)

    def drain(self) -> None:
        """Wait until every block handed over is written (a stopping server's last blocks)."""
        self._queue.join()

    def clear(self) -> int:
        """Remove every block; the bytes freed."""
        self.drain()
        with self._lock:
            keys = list(self._files)
        freed = self.bytes
        for key in keys:
            self._remove(key)
        return freed

    # the writer's thread ---------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            key, payload = self._queue.get()
            try:
                self._write(key, payload)
            except Exception:  # never let one block end the writer: the next ones still go
                log.exception("writing a KV block to disk failed")
            finally:
                with self._lock:
                    self._queued.pop(key, None)
                self._queue.task_done()

    def _write(self, key: str, payload: bytes) -> None:
        if self.stopped is not None:
            return
        path, data = self._path(key), frame_block(payload)
        temp = path.with_name(f"{key}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as out:
                out.write(data)
            os.replace(temp, path)
        except OSError as error:
            _unlink(temp)
            if error.errno in _FULL:
                self.stopped = f"{self.folder.parent}: {error.strerror or error}"
                log.warning("the KV disk tier stops writing (%s); replies go on, its blocks are kept", self.stopped)
            return
        with self._lock:
            self._files[key] = len(data)
            self.bytes += len(data)
            self.written += 1
        self._keep_within()

    def _keep_within(self) -> None:
        """Remove the least recently used blocks while the tier holds more than its budget."""
        while True:
            with self._lock:
                if self.bytes <= self.limit or not self._files:
                    return
                key = next(iter(self._files))
            self._remove(key)

    # both ------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / key

    def _forget(self, key: str) -> None:
        with self._lock:
            self.bytes -= self._files.pop(key, 0)

    def _remove(self, key: str) -> None:
        self._forget(key)
        _unlink(self._path(key))

    def _scan(self) -> None:
        """What an earlier process left: blocks, oldest first; its half-written ``.tmp`` files go."""
        if not self.folder.is_dir():
            return
        found = []
        for sub in self.folder.iterdir():
            if not sub.is_dir():
                continue
            for path in sub.iterdir():
                if path.name.endswith(".tmp"):
                    _unlink(path)
                    continue
                try:
                    stat = path.stat()
                except OSError:
                    continue
                found.append((stat.st_mtime, path.name, stat.st_size))
        for _, key, size in sorted(found):
            self._files[key] = size
            self.bytes += size
        self._keep_within()


_TIERS: dict[Path, DiskTier] = {}
_TIERS_LOCK = threading.Lock()


def open_disk_tier(root: Path, limit: int) -> DiskTier:
    """The process's tier in ``root`` (one per folder: every engine of the process shares its writer and
    budget); a later call with another ``limit`` changes the budget."""
    root = Path(root).expanduser().resolve()
    with _TIERS_LOCK:
        tier = _TIERS.get(root)
        if tier is None:
            tier = _TIERS[root] = DiskTier(root, limit)
        tier.limit = limit
        return tier


def disk_tiers() -> list[DiskTier]:
    """The tiers this process opened (for metrics)."""
    with _TIERS_LOCK:
        return list(_TIERS.values())


def drain_disk_tiers() -> None:
    """Wait for every tier's pending writes (before the process exits)."""
    for tier in list(_TIERS.values()):
        tier.drain()


def _unlink(path: Path) -> None:
    with suppress(OSError):
        path.unlink(missing_ok=True)
