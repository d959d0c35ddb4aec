"""The chats one session store holds, so that no other process changes them (the locks: store_lock.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sessions.errors import SessionFileError, SessionInUseError
from sessions.store_lock import SessionLock

_ELSEWHERE = "is open in another mlxchat window"
_CLOSE = "close it there (switch to another chat, or quit)"
_IN_USE = {  # what could not be done, and what to do instead
    "open": f"{{chat}} {_ELSEWHERE}. Go on with it there, or {_CLOSE} and open it here again.",
    "save": f"{{chat}} {_ELSEWHERE}, so it was not saved over. Save this one as a new chat, or {_CLOSE} first.",
    "rename": f"{{chat}} {_ELSEWHERE}, so it was not renamed. Rename it there, or {_CLOSE} first.",
    "delete": f"{{chat}} {_ELSEWHERE}, so it was not deleted. Delete it there, or {_CLOSE} first.",
}


class Holds:
    """A store's held chats (id -> lock, until released), and the one-off locks of its other changes."""

    def __init__(self, root: Path, suffix: str, name_of: Callable[[str], str], exists: Callable[[str], bool]) -> None:
        # No reference back to the store: a store dropped without ``close`` is freed (and lets go) at once.
        self.root, self.suffix = root, suffix
        self._name_of = name_of  # chat id -> how a message names the chat
        self._exists = exists  # chat id -> whether the store has it (in its index, or as a file)
        self._locks: dict[str, SessionLock] = {}

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._locks

    def claim(self, session_id: str, action: str = "open") -> None:
        """Hold ``session_id`` (a no-op when held); ``action`` words the error if another process has it."""
        if session_id not in self._locks:
            self._locks[session_id] = self._lock(session_id, action, mark_open=True)

    def claim_new(self, propose: Callable[[], str]) -> str:
        """Hold and return the first id from ``propose()`` that no process holds and no file uses."""
        while True:
            session_id = propose()
            path = self._file(session_id)
            try:
                lock = SessionLock.acquire(path, mark_open=True)
            except SessionInUseError:
                continue  # another process is taking the same id right now
            if self._exists(session_id):  # looked at under the lock: whoever saved it has let it go
                lock.release()
                continue
            self._locks[session_id] = lock
            return session_id

    def release(self, session_id: str) -> None:
        """Let other processes have ``session_id`` (a no-op when it is not held)."""
        lock = self._locks.pop(session_id, None)
        if lock is not None:
            self._let_go(session_id, lock)

    def release_all(self) -> None:
        for session_id in list(self._locks):
            self.release(session_id)

    @contextmanager
    def changing(self, session_id: str, action: str) -> Iterator[None]:
        """Hold ``session_id`` for one change: already held, or taken for the change only."""
        if session_id in self._locks:
            yield
            return
        lock = self._lock(session_id, action)
        try:
            yield
        finally:
            self._let_go(session_id, lock)

    def _lock(self, session_id: str, action: str, mark_open: bool = False) -> SessionLock:
        path = self._file(session_id)
        try:
            return SessionLock.acquire(path, mark_open=mark_open)
        except SessionInUseError:
            raise SessionInUseError(_IN_USE[action].format(chat=self._name_of(session_id))) from None

    def _file(self, session_id: str) -> Path:
        return self.root / f"{session_id}{self.suffix}"

    def _let_go(self, session_id: str, lock: SessionLock) -> None:
        try:
            exists = self._exists(session_id)
        except SessionFileError:
            exists = True  # cannot tell (a damaged index): keep its lock files
        if exists:
            lock.release()
        else:
            lock.remove()  # no chat (deleted, or an id never saved): its lock files go too
