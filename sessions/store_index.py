"""The session store's index: chats, their messages and the blocks their caches hold (store_db.py).

Every change is one transaction, and ``write`` changes only what differs from what
is stored: a turn rewrites the chat's row, adds its new messages and block rows,
and drops the rows of blocks the chat no longer holds (returned, for GC). Reads
happen in one transaction too, so they see one committed state.

Pure Python (no MLX): the chat window's process writes history here when the engine died.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from sessions.errors import SessionFileError
from sessions.store_db import StoreDatabase, database_path, errors_in_words, transaction
from sessions.titles import shown_title

_KEYS_PER_QUERY = 500  # under SQLite's limit on bound parameters (999 in older builds)


@dataclass(frozen=True)
class ChatSummary:
    """What a list shows about a chat: one row, no header parsed."""

    id: str
    shown: str
    updated: float
    messages: int
    model: str


@dataclass(frozen=True)
class StoredBlock:
    key: str  # content address (block_keys.py)
    tokens: bytes  # the token ids it covers (block_keys.token_bytes)


@dataclass(frozen=True)
class ChatRecord:
    """One chat as the index holds it."""

    title: str | None
    created: float
    updated: float
    model: str  # for lists: the model's name, else its fingerprint
    header: dict[str, object]  # the session header without history, title, times and cached token ids
    history: tuple[tuple[str, str], ...]  # (role, content) after the system prompt
    blocks: dict[str, tuple[StoredBlock, ...]]  # role -> its cache's blocks in order

    @property
    def shown(self) -> str:
        return shown_title(self.title, self.history)


class StoreIndex:
    """The index of the store in ``root`` (``store.sqlite``; made by the first write)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._db = StoreDatabase(self.root)

    def close(self) -> None:
        """Close its connection (the next call opens it again)."""
        self._db.close()

    def summaries(self) -> list[ChatSummary]:
        with self._db.use(create=False) as db:
            if db is None:
                return []
            with self._reading():
                rows = db.execute("SELECT id, shown, updated, messages, model FROM chats").fetchall()
        return [ChatSummary(*row) for row in rows]

    def summary(self, chat: str) -> ChatSummary | None:
        with self._db.use(create=False) as db:
            if db is None:
                return None
            with self._reading():
                row = db.execute("SELECT id, shown, updated, messages, model FROM chats WHERE id = ?",
                                 (chat,)).fetchone()
        return None if row is None else ChatSummary(*row)

    def has(self, chat: str) -> bool:
        return self.summary(chat) is not None

    def read(self, chat: str) -> ChatRecord | None:
        """The chat as last committed, or None."""
        with self._db.use(create=False) as db:
            if db is None:
                return None
            with self._reading(), transaction(db, write=False):
                row = db.execute("SELECT title, created, updated, model, header FROM chats WHERE id = ?",
                                 (chat,)).fetchone()
                if row is None:
                    return None
                history = _history(db, chat)
                blocks: dict[str, list[StoredBlock]] = {}
                for role, key, tokens in db.execute("SELECT role, key, tokens FROM blocks WHERE chat = ? "
                                                    "ORDER BY role, n", (chat,)):
                    blocks.setdefault(role, []).append(StoredBlock(key, bytes(tokens)))
        title, created, updated, model, text = row
        try:
            header: object = json.loads(text)
        except ValueError:
            header = None
        if not isinstance(header, dict):
            raise SessionFileError(f"Chat {chat} in the session store {self.root} has a damaged header "
                                   "(not a JSON object): the store's index is damaged.")
        return ChatRecord(title, created, updated, model, header, tuple((r, c) for r, c in history),
                          {role: tuple(found) for role, found in blocks.items()})

    def write(self, chat: str, record: ChatRecord) -> list[str]:
        """Make ``chat`` hold ``record``, writing only what changed; returns the keys it stopped holding."""
        with self._db.use(create=True) as made, self._writing(), transaction(_made(made), write=True) as db:
            db.execute("INSERT OR REPLACE INTO chats (id, title, shown, created, updated, messages, model, header) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (chat, record.title, record.shown, record.created, record.updated, len(record.history),
                        record.model, json.dumps(record.header, ensure_ascii=False, separators=(",", ":"))))
            _write_history(db, chat, record.history)
            dropped = []
            stored_roles = {role for (role,) in db.execute("SELECT DISTINCT role FROM blocks WHERE chat = ?",
                                                           (chat,))}
            for role in sorted(stored_roles | set(record.blocks)):
                dropped += _write_blocks(db, chat, role, record.blocks.get(role, ()))
        return dropped

    def set_title(self, chat: str, title: str | None) -> bool:
        """Retitle ``chat`` (its time stays); False when there is no such chat."""
        with self._db.use(create=False) as db:
            if db is None:
                return False
            with self._writing(), transaction(db, write=True):
                history = _history(db, chat)
                changed = db.execute("UPDATE chats SET title = ?, shown = ? WHERE id = ?",
                                     (title, shown_title(title, history), chat)).rowcount
        return bool(changed)

    def set_history(self, chat: str, history: Sequence[tuple[str, str]], updated: float) -> bool | None:
        """Make ``chat``'s history ``history`` (its caches stay); False if it already was, None if no chat."""
        with self._db.use(create=False) as db:
            if db is None:
                return None
            with self._writing(), transaction(db, write=True):
                row = db.execute("SELECT title FROM chats WHERE id = ?", (chat,)).fetchone()
                if row is None:
                    return None
                if not _write_history(db, chat, history):
                    return False
                db.execute("UPDATE chats SET updated = ?, messages = ?, shown = ? WHERE id = ?",
                           (updated, len(history), shown_title(row[0], history), chat))
        return True

    def delete(self, chat: str) -> list[str] | None:
        """Remove ``chat``; returns the keys of the blocks it held (None if there was no such chat)."""
        with self._db.use(create=False) as db:
            if db is None:
                return None
            with self._writing(), transaction(db, write=True):
                keys = [key for (key,) in db.execute("SELECT key FROM blocks WHERE chat = ?", (chat,))]
                if not db.execute("DELETE FROM chats WHERE id = ?", (chat,)).rowcount:
                    return None
                db.execute("DELETE FROM messages WHERE chat = ?", (chat,))
                db.execute("DELETE FROM blocks WHERE chat = ?", (chat,))
        return keys

    def referenced(self, keys: Iterable[str] | None = None) -> set[str]:
        """Which of ``keys`` (all keys, when None) some chat holds."""
        with self._db.use(create=False) as db:
            if db is None:
                return set()
            with self._reading():
                if keys is None:
                    return {key for (key,) in db.execute("SELECT DISTINCT key FROM blocks")}  # one scan
                # An autosave's few dropped keys: filtered in SQLite, no set of the whole store's keys.
                wanted, held = sorted(set(keys)), set[str]()
                for start in range(0, len(wanted), _KEYS_PER_QUERY):
                    chunk = wanted[start:start + _KEYS_PER_QUERY]
                    marks = ",".join("?" * len(chunk))
                    held.update(key for (key,) in db.execute(
                        f"SELECT DISTINCT key FROM blocks WHERE key IN ({marks})", chunk))
                return held

    def checkpoint(self) -> None:
        """Copy the committed pages from the WAL into the database file now (SQLite does it by itself
        every ~1,000 pages); for measurements that must count those writes in the save that caused them."""
        with self._db.use(create=False) as db:
            if db is not None:
                with self._writing():
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _reading(self) -> AbstractContextManager[None]:
        return errors_in_words(database_path(self.root), writing=False)

    def _writing(self) -> AbstractContextManager[None]:
        return errors_in_words(database_path(self.root), writing=True)


def _made(db: sqlite3.Connection | None) -> sqlite3.Connection:
    assert db is not None, "use(create=True) makes the store"
    return db


def _history(db: sqlite3.Connection, chat: str) -> list[tuple[str, str]]:
    return db.execute("SELECT role, content FROM messages WHERE chat = ? ORDER BY n", (chat,)).fetchall()


def _write_history(db: sqlite3.Connection, chat: str, history: Sequence[tuple[str, str]]) -> bool:
    """Rewrite only the messages that differ; True when something changed."""
    stored = _history(db, chat)
    changed = [(chat, n, role, content) for n, (role, content) in enumerate(history)
               if n >= len(stored) or tuple(stored[n]) != (role, content)]
    db.executemany("INSERT OR REPLACE INTO messages (chat, n, role, content) VALUES (?, ?, ?, ?)", changed)
    extra = db.execute("DELETE FROM messages WHERE chat = ? AND n >= ?", (chat, len(history))).rowcount
    return bool(changed or extra)


def _write_blocks(db: sqlite3.Connection, chat: str, role: str, blocks: Sequence[StoredBlock]) -> list[str]:
    """Keep the rows up to the first difference, replace the rest; returns the keys dropped."""
    stored = [key for (key,) in db.execute("SELECT key FROM blocks WHERE chat = ? AND role = ? ORDER BY n",
                                          (chat, role))]
    same = 0
    while same < min(len(stored), len(blocks)) and stored[same] == blocks[same].key:
        same += 1
    db.execute("DELETE FROM blocks WHERE chat = ? AND role = ? AND n >= ?", (chat, role, same))
    db.executemany("INSERT INTO blocks (chat, role, n, key, tokens) VALUES (?, ?, ?, ?, ?)",
                   [(chat, role, n, block.key, block.tokens) for n, block in enumerate(blocks) if n >= same])
    return stored[same:]
