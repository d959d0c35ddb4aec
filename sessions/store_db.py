"""The session store's SQLite database: opening it (WAL), its schema, and errors in words.

``store.sqlite`` in the store's folder holds the index: one row per chat (what
lists show, plus the rest of its header as JSON), its messages, and which blocks
each of its caches holds. WAL mode lets windows list the store while another one
saves, and a commit is the single atomic step of every save (see store_index.py).

Pure Python (no MLX): the chat window's process writes history here when the engine died.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sessions.errors import SessionFileError, SessionSaveError
from sessions.file_format import write_error_text

NAME = "store.sqlite"
SUFFIX = ".mlxchat"  # a chat's address in a store is <store>/<id>.mlxchat: its locks' name, and its file before
                     # the index existed (those files are still listed and opened, and move in on their next save)
SCHEMA_VERSION = 1
BUSY_SECONDS = 30.0  # another process's commit takes milliseconds; this is only a bound for a stuck one

# Small pages: an autosave changes a few small rows, and every page it touches is written twice (the WAL,
# then the database at a checkpoint), so 1 KiB pages write about a quarter of what 4 KiB ones do.
PAGE_BYTES = 1024

# WITHOUT ROWID: each table is one B-tree on its key, so a row written touches no second index. Blocks
# have no index on their key: GC looks keys up in one scan of all rows, and saves stay cheaper.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id TEXT PRIMARY KEY,
    title TEXT,                -- the user's title, or NULL: lists show the first user message
    shown TEXT NOT NULL,       -- what lists show
    created REAL NOT NULL,     -- seconds since the epoch
    updated REAL NOT NULL,
    messages INTEGER NOT NULL, -- in the history (the system prompt not counted)
    model TEXT NOT NULL,       -- the model's name, else its fingerprint
    header TEXT NOT NULL       -- the rest of the session header, JSON (file_header.py without history,
                               -- title, times and cached token ids)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
    chat TEXT NOT NULL,
    n INTEGER NOT NULL,        -- 0 = the first message after the system prompt
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (chat, n)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blocks (
    chat TEXT NOT NULL,
    role TEXT NOT NULL,        -- "target" or "draft"
    n INTEGER NOT NULL,        -- the block's place in the cache, 0 first
    key TEXT NOT NULL,         -- its content address (block_keys.py), the name of its file
    tokens BLOB NOT NULL,      -- the token ids it covers, little-endian u32
    PRIMARY KEY (chat, role, n)
) WITHOUT ROWID;
"""


def database_path(root: Path) -> Path:
    return Path(root) / NAME


class StoreDatabase:
    """The store's database, one connection kept open while the object lives (or until ``close``).

    Kept open because SQLite removes the WAL's shared-memory file when the last
    connection closes, and a process that opens the store on a full disk could then
    not even read it. Threads may share it: ``use`` serializes them.
    """

    def __init__(self, root: Path) -> None:
        self.path = database_path(root)
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.RLock()

    @contextmanager
    def use(self, *, create: bool) -> Iterator[sqlite3.Connection | None]:
        """The connection (None when there is no store yet and ``create`` is False), for this thread alone.

        In autocommit mode: callers open their own transactions (``transaction``).
        """
        with self._lock:
            if self._connection is None:
                self._connection = self._open(create)
            yield self._connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _open(self, create: bool) -> sqlite3.Connection | None:
        if not create and not self.path.is_file():
            return None
        with errors_in_words(self.path, writing=create):
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None,
                                         check_same_thread=False)
            try:
                if _prepare(connection, self.path, create):
                    return connection
            except BaseException:
                connection.close()
                raise
        connection.close()
        return None  # a store another process is making right now: empty so far


@contextmanager
def transaction(connection: sqlite3.Connection, *, write: bool) -> Iterator[sqlite3.Connection]:
    """One transaction; a write one takes the write lock at once (no deadlock on upgrade)."""
    connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield connection
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:  # also after a COMMIT that failed (a full disk): the connection stays usable
            try:
                connection.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the error being raised says more
        raise


@contextmanager
def errors_in_words(path: Path, *, writing: bool) -> Iterator[None]:
    """Turn sqlite3's errors into ``SessionFileError``s that say what is wrong and what to do."""
    try:
        yield
    except sqlite3.Error as error:
        raise _in_words(error, path, writing) from error


def _in_words(error: sqlite3.Error, path: Path, writing: bool) -> SessionFileError:
    extended: int | None = getattr(error, "sqlite_errorcode", None)
    code = extended & 0xFF if extended is not None else None  # extended codes keep the primary one in the low byte
    as_os = None if code is None else {sqlite3.SQLITE_FULL: errno.ENOSPC, sqlite3.SQLITE_READONLY: errno.EROFS,
             sqlite3.SQLITE_PERM: errno.EACCES, sqlite3.SQLITE_CANTOPEN: errno.EACCES}.get(code)
    if as_os is not None and writing:
        reason = {errno.ENOSPC: "No space left on device"}.get(as_os, str(error))
        return SessionSaveError(write_error_text(path, OSError(as_os, reason)))
    if code == sqlite3.SQLITE_IOERR:
        return SessionFileError(f"Cannot use the session store's index {path}: {error} (is the disk full? "
                                "Free some space and try again).")
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return SessionFileError(f"The session store's index {path} is damaged ({error}). Move it away to "
                                "start a new store; the chats in it cannot be read.")
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return SessionFileError(f"The session store {path.parent} stayed busy for {BUSY_SECONDS:.0f} s "
                                "(another mlxchat process is stuck writing it): try again.")
    return SessionFileError(f"Cannot use the session store's index {path}: {error}.")


def _switch_to_wal(connection: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode=WAL`` (persistent: recorded in the file once), retried while another process reads.

    Switching needs the database to itself, and SQLite fails it at once instead of waiting when another
    connection holds a read lock (two windows making a new store at the same moment did, 1 time in 4).
    """
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            code = getattr(error, "sqlite_errorcode", sqlite3.SQLITE_BUSY) & 0xFF
            if code not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _prepare(connection: sqlite3.Connection, path: Path, create: bool) -> bool:
    """Check the schema's version, making the schema when ``create``; False: there is no schema (yet)."""
    version: int = connection.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SessionFileError(f"The session store {path.parent} was written by a newer mlxchat (store "
                               f"schema {version}; this one reads {SCHEMA_VERSION}): update mlxchat.")
    # FULL: a commit survives a power cut, not only a crash (the chat's last good state is the committed one)
    connection.execute("PRAGMA synchronous=FULL")
    if version == SCHEMA_VERSION or not create:
        return version == SCHEMA_VERSION
    connection.execute(f"PRAGMA page_size={PAGE_BYTES}")  # only takes effect before the first table exists
    _switch_to_wal(connection)
    with transaction(connection, write=True):
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    return True
