"""Advisory locks that keep two mlxchat processes from writing the same stored chat.

A session file ``DIR/NAME`` gets two hidden lock files beside it (beside its target, if it is a
symlink: a save writes the target). They are never the
session file itself, because a save replaces that file by rename and a lock on the
old file would silently stop counting.

- ``DIR/.NAME.lock``: who may write the chat. It is taken exclusively. Its holder
  writes what it is into it ("window", "ask"): a second taker fails at once, except
  that one given ``wait_s`` waits while the holder is an ``ask`` (one turn, then it
  lets go), never for a window, which may keep the chat open for hours.
- ``DIR/.NAME.open``: also held by a process that keeps the chat open, so that
  ``is_open`` can answer without touching the first lock. A probe on the first lock
  could make another process's open or delete fail for no reason.

These are ``flock`` locks (macOS and Linux). The OS drops them when their process
ends, however it ends, so a crash never leaves a chat locked. Two separate
acquisitions conflict even inside one process. An orphaned lock file is harmless,
and ``remove`` deletes both files along with the chat.

API (pure Python, no mlx; the UI process uses it too). ``path`` is the session file,
e.g. ``<store>/<id>.mlxchat`` (``SessionStore.path_for(id)``, ``Conversation.file``)::

    lock = SessionLock.acquire(path)                  # SessionInUseError at once if another holder has it
    lock = SessionLock.acquire(path, mark_open=True)  # and show the chat as open (``is_open``)
    lock = SessionLock.acquire(path, holder="ask", wait_s=600, on_wait=say)  # wait for another ask's turn
    lock.release()                                    # or: with SessionLock.acquire(path): write the file
    lock.remove()                                     # after deleting the chat: drop its lock files, release
    is_open(path) -> bool                             # does a holder (this process included) keep it open?

``acquire`` raises ``SessionFileError`` when the lock file cannot be made or locked
(a read-only folder, a mount without locks). Both errors are ``MlxchatError``s whose
message says what to do.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from sessions.errors import SessionFileError, SessionInUseError

NOTICE_S = 1.0  # a wait longer than this is announced
POLL_S = 0.1  # how often a waiting taker tries again


class SessionLock:
    """The write lock of one session file, held until ``release`` (or until the process ends)."""

    def __init__(self, path: Path, fd: int, open_fd: int | None) -> None:
        self.path = path  # the session file it guards
        self._fds = [fd] if open_fd is None else [open_fd, fd]  # released in this order

    @classmethod
    def acquire(cls, path: Path, *, mark_open: bool = False, holder: str = "window", wait_s: float = 0.0,
                on_wait: Callable[[], None] | None = None) -> SessionLock:
        """Lock ``path``; ``mark_open``: also show it as open to ``is_open``. ``holder`` says what takes it.

        Held by another ``ask``: retried for up to ``wait_s`` seconds, calling ``on_wait()`` once when the
        wait passes ``NOTICE_S``. Held by anything else, or still held then: ``SessionInUseError``.
        """
        path = Path(path)
        fd = _wait_for_lock(path, wait_s, on_wait)
        try:
            _say_holder(fd, holder)
            # Blocks only while an is_open probe holds its shared lock (microseconds): nothing else takes it.
            open_fd = _locked_fd(open_file(path), fcntl.LOCK_EX) if mark_open else None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, open_fd)

    def release(self) -> None:
        """Let other processes take it (closing the files drops the locks); a second call does nothing."""
        while self._fds:
            os.close(self._fds.pop())

    def remove(self) -> None:
        """Delete the lock files (the chat is gone), then release. Takers that opened them meanwhile retry."""
        for file in (open_file(self.path), lock_file(self.path)):
            file.unlink(missing_ok=True)
        self.release()

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()  # a store dropped without releasing lets its chats go (CPython frees it at once)


def _wait_for_lock(path: Path, wait_s: float, on_wait: Callable[[], None] | None) -> int:
    start = time.monotonic()
    told = False
    while (fd := _locked_fd(lock_file(path), fcntl.LOCK_EX | fcntl.LOCK_NB)) is None:
        other, waited = _holder(path), time.monotonic() - start
        if other != "ask" or waited >= wait_s:
            raise SessionInUseError(_in_use_text(path.name, other, wait_s))
        if not told and waited >= NOTICE_S and on_wait is not None:
            on_wait()
            told = True
        time.sleep(POLL_S)
    return fd


def _in_use_text(name: str, holder: str, wait_s: float) -> str:
    if holder != "ask":
        return f"{name} is open in another mlxchat window: close it there first."
    if wait_s > 0:
        return f"{name} is still in use by another `mlxchat ask` after {wait_s:.0f} s: try again when it has finished."
    return f"{name} is in use by another `mlxchat ask`: try again when it has finished."


def _holder(path: Path) -> str:
    """What holds ``path``'s lock, as it wrote; "" when unknown (an mlxchat from before holders wrote it)."""
    try:
        return lock_file(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _say_holder(fd: int, holder: str) -> None:
    """Write ``holder`` into the lock file we hold (only when it changes: a save's bytes are counted)."""
    data = holder.encode()
    if os.pread(fd, 64, 0) != data:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


def is_open(path: Path) -> bool:
    """Whether a holder with ``mark_open`` has ``path`` open; never waits, never makes a taker fail."""
    try:
        fd = os.open(open_file(Path(path)), os.O_RDONLY)
    except OSError:
        return False  # no marker (never opened, or removed), or unreadable: nothing says it is open
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # a folder without locks (some network mounts): a listing shows it as closed
    finally:
        os.close(fd)
    return False


def lock_file(path: Path) -> Path:
    return _beside(path, "lock")


def open_file(path: Path) -> Path:
    return _beside(path, "open")


def _beside(path: Path, kind: str) -> Path:
    """A lock file beside the file a save writes: a symlink's target (every name of one file, one lock)."""
    real = Path(os.path.realpath(path))
    return real.with_name(f".{real.name}.{kind}")


def _locked_fd(file: Path, mode: int) -> int | None:
    """A descriptor of ``file`` locked with ``mode``, or None when a non-blocking ``mode`` is refused."""
    while True:
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise SessionFileError(f"Cannot create the lock file {file}: {error.strerror or error}. "
                                   f"Check that {file.parent} is writable.") from error
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as error:
            os.close(fd)
            raise SessionFileError(f"Cannot lock {file}: {error.strerror or error}. Keep the sessions "
                                   "in a local folder (set MLXCHAT_HOME).") from error
        except BaseException:
            os.close(fd)
            raise
        if _is_current(fd, file):
            return fd
        os.close(fd)  # removed between our open and our lock: lock the file that is there now


def _is_current(fd: int, file: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(file)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
