"""The session store: every autosaved chat, in one folder shared by all mlxchat processes.

``SessionStore().save(session)`` (autosave) gives the session an id the first
time and updates the same chat afterwards, writing only what changed: the new
messages and the cache blocks the turn filled (store_chat.py). The folder holds
``store.sqlite`` (the index: titles, times, headers, messages, which blocks each
chat holds; store_index.py) and ``blocks/`` (content-addressed KV blocks shared by
every chat that holds the same tokens; block_files.py). ``list`` reads the index's
rows only. Blocks no chat holds any more are deleted by store_gc.py.

Chat files of earlier versions (``<id>.mlxchat`` in the folder) are still listed
and opened; their next save moves them into the index. A file that cannot be read
is listed as broken instead of failing the listing.

Several processes (mlxchat windows, `mlxchat sessions`) may use one store. A
store *holds* the chats it has open (``load``, ``save``, ``new_id``) with a
``SessionLock`` (store_lock.py) until ``release``: while it does, other processes can neither
open, save, rename nor delete them (``SessionInUseError``), so no window
overwrites another's turns or brings back a chat deleted elsewhere.
"""

from __future__ import annotations

import builtins
import os
import secrets
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.errors import SessionFileError, SessionNotFoundError
from sessions.export import transcript_markdown
from sessions.file_header import SavedSession
from sessions.messages import Message
from sessions.session_file import read_session
from sessions.store_chat import ChatCut, SaveReport, commit_chat, cut_chat, export_file, load_chat, read_saved
from sessions.store_db import SUFFIX
from sessions.store_files import (ID, chat_files, copy_checked, mtime, remove_quietly, retitle,
                                  saved_in)
from sessions.store_gc import collect
from sessions.store_holds import Holds
from sessions.store_index import ChatSummary, StoreIndex
from sessions.store_lock import is_open
from sessions.temp_files import sweep_dead_temps
from sessions.titles import shown_title

if TYPE_CHECKING:
    from mlxcore import Engine
    from sessions.chat_session import ChatSession


@dataclass(frozen=True)
class SessionInfo:
    """What a session list shows about one stored session."""

    id: str
    title: str
    path: Path  # its address, <store>/<id>.mlxchat: a file only for chats of earlier versions (``in_file``)
    updated: float  # seconds since the epoch (the file's time when it is broken)
    messages: int  # messages in the history, the system prompt not counted
    model: str  # the model's name, else its fingerprint
    broken: str | None = None  # why the file cannot be opened, or None
    open_elsewhere: bool = False  # another store (another mlxchat window) has it open
    in_file: bool = False  # kept in its own file by an earlier version, not yet moved into the index


def default_root() -> Path:
    """``$MLXCHAT_HOME/sessions``, else the platform's per-user data folder + ``mlxchat/sessions``."""
    if os.environ.get("MLXCHAT_HOME"):
        return Path(os.environ["MLXCHAT_HOME"]).expanduser() / "sessions"
    home = Path.home()
    if sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or home / "AppData" / "Roaming")
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    return base / "mlxchat" / "sessions"


class SessionStore:
    """Stored sessions under ``root`` (default: ``default_root()``); see the module docstring."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        sweep_dead_temps(self.root)  # what saves killed half way left (kill -9 skips their cleanup)
        self._index = StoreIndex(self.root)
        # The chats open here: no other process may change them. No reference back to the store (a store
        # dropped without ``close`` is freed, and lets its chats go, at once): functions of the index only.
        self._held = Holds(self.root, SUFFIX, partial(_chat_name, self._index), partial(_has, self._index))
        self.last_save: SaveReport | None = None  # what the last ``save`` wrote

    def new_id(self) -> str:
        """A fresh id, held by this store until ``release``: no other process can take it meanwhile."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self._held.claim_new(_fresh_id)

    def claim(self, session_id: str) -> None:
        """Hold ``session_id`` open here (``SessionInUseError`` if another process does); a no-op when held."""
        self.path_for(session_id)
        self._held.claim(session_id)

    def release(self, session_id: str) -> None:
        """Let other processes open ``session_id`` again (a no-op when it is not held here)."""
        self._held.release(session_id)

    def close(self) -> None:
        """Release every chat held here (a process that ends releases them too, however it ends)."""
        self._held.release_all()
        self._index.close()

    def path_for(self, session_id: str) -> Path:
        """The address of ``session_id`` (``<store>/<id>.mlxchat``; a file only for an earlier version's chat).

        Its lock files are named after it, and ``sessions.salvage.save_history`` takes it.
        """
        if not ID.fullmatch(session_id):
            raise SessionNotFoundError(f"{session_id!r} is not a session id (see `mlxchat sessions ls`).")
        return self._file(session_id)

    def list(self) -> list[SessionInfo]:
        """Every stored session, most recently updated first (index rows only; broken files included)."""
        if not self.root.is_dir():
            return []
        indexed = {summary.id: summary for summary in self._index.summaries()}
        infos = [self._summary_info(summary) for summary in indexed.values()]
        infos += [self._file_info(session_id, path) for session_id, path in chat_files(self.root)
                  if session_id not in indexed]
        return sorted(infos, key=lambda info: (info.updated, info.id), reverse=True)

    def info(self, session_id: str) -> SessionInfo:
        """What ``list`` says about one session."""
        self.path_for(session_id)
        summary = self._index.summary(session_id)
        return self._summary_info(summary) if summary else self._file_info(session_id, self._existing(session_id))

    def read(self, session_id: str) -> SavedSession:
        """The checked header of a stored session: settings, history, cached token ids (no cache read)."""
        self.path_for(session_id)
        saved = read_saved(self._index, session_id)
        return saved or saved_in(self._existing(session_id))

    def search(self, text: str) -> builtins.list[SessionInfo]:  # (``list`` is a method here)
        """Sessions whose title contains ``text`` (ignoring case), most recent first."""
        needle = text.casefold()
        return [info for info in self.list() if needle in info.title.casefold()]

    def save(self, session: ChatSession, session_id: str | None = None) -> SessionInfo:
        """Write ``session`` under ``session_id``, else the id it was saved or loaded with, else a new one.

        The id is held from then on (see ``claim``); a first save that fails lets it go again.
        """
        session_id = session_id or session.store_id
        held = session_id is not None and session_id in self._held
        if session_id is None:
            session_id = self.new_id()
        else:
            self.path_for(session_id)  # a bad id fails before a folder is made
            self.root.mkdir(parents=True, exist_ok=True)
            self._held.claim(session_id, "save")
        try:
            cut = cut_chat(session, session.created_at or time.time())
            self.last_save = self._write(session_id, cut)
        except BaseException:
            if not held:
                self.release(session_id)
            raise
        session.created_at, session.store_id = cut.header["created"], session_id
        return self.info(session_id)

    def _write(self, session_id: str, cut: ChatCut) -> SaveReport:
        """The disk half of ``save`` (the caller holds ``session_id``): blocks, index commit, then GC."""
        path = self._file(session_id)
        sweep_dead_temps(path.parent, also=path.name)
        report = commit_chat(self._index, session_id, cut)
        remove_quietly(path)  # an earlier version's file: the index holds the chat now
        if report.dropped:
            collect(self._index, report.dropped)  # the old tail, a replaced reply (skipped when busy)
        return report

    def load(self, session_id: str, engine: Engine) -> ChatSession:
        """Open a stored session on ``engine`` (see ``ChatSession.load``) and hold it; ``save`` updates it."""
        self._existing(session_id)
        held = session_id in self._held
        self.claim(session_id)
        try:  # looked for again under the lock: it may have been deleted just before
            opened = load_chat(self._index, session_id, engine) or read_session(self._existing(session_id), engine)
            from sessions.chat_session import ChatSession
            session = ChatSession.opened(opened, engine)
        except BaseException:
            if not held:
                self.release(session_id)
            raise
        session.store_id = session_id
        return session

    def rename(self, session_id: str, title: str) -> SessionInfo:
        """Set a session's title (rewrites its header atomically; the caches are copied as they are)."""
        if not title.strip():
            raise SessionFileError("A session title cannot be empty.")
        self._existing(session_id)
        with self._held.changing(session_id, "rename"):
            if not self._index.set_title(session_id, " ".join(title.split())):
                retitle(self._existing(session_id), " ".join(title.split()))
        return self.info(session_id)

    def delete(self, session_id: str) -> None:
        """Remove a stored session (and its lock files, and the blocks no other chat holds)."""
        self._existing(session_id)
        with self._held.changing(session_id, "delete"):
            keys = self._index.delete(session_id)
            path = self._file(session_id)
            try:
                path.unlink(missing_ok=keys is not None)
            except FileNotFoundError:
                raise SessionNotFoundError(self._missing(session_id)) from None
            except OSError as error:
                raise SessionFileError(f"Cannot delete {path}: {error.strerror or error}.") from error
        self.release(session_id)
        collect(self._index)  # its blocks, and whatever killed saves left (skipped when a save is under way)

    def export_file(self, session_id: str, path: Path) -> None:
        """Write a stored session as one self-contained session file (``ChatSession.load`` opens it)."""
        self.path_for(session_id)
        if not export_file(self._index, session_id, Path(path)):
            copy_checked(self._existing(session_id), Path(path))

    def checkpoint(self) -> None:
        """Write the index's WAL into its database file now (SQLite does it every ~1,000 pages by itself);
        for measurements that count a save's bytes (bench/session_store.py)."""
        self._index.checkpoint()

    def collect_garbage(self) -> int | None:
        """Delete the blocks no chat holds; the number of files removed, None if a save was under way."""
        return collect(self._index) if self.root.is_dir() else 0

    def export_markdown(self, session: str | ChatSession) -> str:
        """A Markdown transcript of a stored session (by id) or of a live ``ChatSession``."""
        if not isinstance(session, str):
            return transcript_markdown(session.display_title(), session.history,
                                       model=session.engine.model_name or "")
        saved = self.read(session)
        messages = ([Message("system", saved.system)] if saved.system else []) + list(saved.history)
        return transcript_markdown(_title(saved), messages, model=_model(saved), updated=saved.updated)

    # internals ------------------------------------------------------------------------------

    def _file(self, session_id: str) -> Path:
        return self.root / f"{session_id}{SUFFIX}"

    def _existing(self, session_id: str) -> Path:
        """The address of a chat the store has (in its index or as a file); ``SessionNotFoundError`` if none."""
        path = self.path_for(session_id)
        if not self._has(session_id):
            raise SessionNotFoundError(self._missing(session_id))
        return path

    def _missing(self, session_id: str) -> str:
        return f"There is no session {session_id!r} in {self.root} (see `mlxchat sessions ls`)."

    def _has(self, session_id: str) -> bool:
        return _has(self._index, session_id)

    def _summary_info(self, summary: ChatSummary) -> SessionInfo:
        path = self._file(summary.id)
        return SessionInfo(summary.id, summary.shown, path, summary.updated, summary.messages, summary.model,
                           open_elsewhere=summary.id not in self._held and is_open(path))

    def _file_info(self, session_id: str, path: Path) -> SessionInfo:
        elsewhere = session_id not in self._held and is_open(path)
        try:
            saved = saved_in(path)
        except SessionFileError as error:
            return SessionInfo(session_id, session_id, path, mtime(path), 0, "", broken=str(error),
                               open_elsewhere=elsewhere, in_file=True)
        return SessionInfo(session_id, _title(saved), path, saved.updated, len(saved.history), _model(saved),
                           open_elsewhere=elsewhere, in_file=True)


def _has(index: StoreIndex, session_id: str) -> bool:
    """Whether the store has ``session_id``: in its index, or as an earlier version's file."""
    return (index.root / f"{session_id}{SUFFIX}").is_file() or index.has(session_id)


def _chat_name(index: StoreIndex, session_id: str) -> str:
    """How a message names a stored chat: its title and id."""
    try:
        summary = index.summary(session_id)  # the index's title column: no messages or blocks read
        title = summary.shown if summary else _title(saved_in(index.root / f"{session_id}{SUFFIX}"))
        return f"Chat {title!r} ({session_id})"
    except SessionFileError:
        return f"Chat {session_id}"


def _fresh_id() -> str:
    """The time (so ids sort by creation) and a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def _title(saved: SavedSession) -> str:
    return shown_title(saved.title, ((m.role, m.content) for m in saved.history))


def _model(saved: SavedSession) -> str:
    return saved.model_name or saved.model_fingerprint
