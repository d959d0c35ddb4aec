"""The session store: one session file per conversation in the platform's data folder.

``SessionStore().save(session)`` (autosave) gives the session an id the first
time and rewrites the same file afterwards; ``list`` reads headers only, and a
file it cannot read is listed as broken instead of failing the listing.

Several processes (mlxchat windows, `mlxchat sessions`) may use one store. A
store *holds* the chats it has open (``load``, ``save``, ``new_id``) with a
``SessionLock`` (store_lock.py) until ``release``: while it does, other processes can neither
open, save, rename nor delete them (``SessionInUseError``), so no window
overwrites another's turns or brings back a chat deleted elsewhere.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from mlxcore.engine import Engine
from sessions.errors import SessionFileError, SessionNotFoundError
from sessions.export import transcript_markdown
from sessions.file_format import encode_header, read_header, rewrite_header
from sessions.file_header import SavedSession, read_saved_session
from sessions.messages import Message
from sessions.session_file import load_session, save_session
from sessions.store_holds import Holds
from sessions.store_lock import is_open

if TYPE_CHECKING:
    from sessions.chat_session import ChatSession

SUFFIX = ".mlxchat"
STALE_SECONDS = 3600
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class SessionInfo:
    """What a session list shows about one stored session."""

    id: str
    title: str
    path: Path
    updated: float  # seconds since the epoch (the file's time when it is broken)
    messages: int  # messages in the history, the system prompt not counted
    model: str  # the model's name, else its fingerprint
    broken: str | None = None  # why the file cannot be opened, or None
    open_elsewhere: bool = False  # another store (another mlxchat window) has it open


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
    """Stored sessions under ``root`` (default: ``default_root()``), one ``<id>.mlxchat`` file each."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self._held = Holds(self.root, SUFFIX, _chat_name)  # the chats open here: no other process may change them

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

    def path_for(self, session_id: str) -> Path:
        """The file of ``session_id`` (which need not exist yet)."""
        if not _ID.fullmatch(session_id):
            raise SessionNotFoundError(f"{session_id!r} is not a session id (see `mlxchat sessions ls`).")
        return self._file(session_id)

    def list(self) -> list[SessionInfo]:
        """Every stored session, most recently updated first (headers only; broken files included)."""
        if not self.root.is_dir():
            return []
        infos = [self._info(path.name[: -len(SUFFIX)], path) for path in self.root.glob(f"*{SUFFIX}")
                 if _ID.fullmatch(path.name[: -len(SUFFIX)])]
        return sorted(infos, key=lambda info: (info.updated, info.id), reverse=True)

    def info(self, session_id: str) -> SessionInfo:
        """What ``list`` says about one session."""
        return self._info(session_id, self._existing(session_id))

    def search(self, text: str) -> list[SessionInfo]:
        """Sessions whose title contains ``text`` (ignoring case), most recent first."""
        needle = text.casefold()
        return [info for info in self.list() if needle in info.title.casefold()]

    def save(self, session: ChatSession, session_id: str | None = None) -> SessionInfo:
        """Write ``session`` under ``session_id``, else the id it was saved or loaded with, else a new one.

        The id is held from then on (see ``claim``); a first save that fails lets it go again.
        """
        session_id = session_id or session.store_id
        held = session_id in self._held
        if session_id is None:
            session_id = self.new_id()
        else:
            self.path_for(session_id)  # a bad id fails before a folder is made
            self.root.mkdir(parents=True, exist_ok=True)
            self._held.claim(session_id, "save")
        path = self._file(session_id)
        try:
            self._remove_stale_temps(path)
            save_session(session, path)
        except BaseException:
            if not held:
                self.release(session_id)
            raise
        session.store_id = session_id
        return self.info(session_id)

    def load(self, session_id: str, engine: Engine) -> ChatSession:
        """Open a stored session on ``engine`` (see ``load_session``) and hold it; ``save`` updates it."""
        self._existing(session_id)
        held = session_id in self._held
        self.claim(session_id)
        try:  # looked for again under the lock: it may have been deleted just before
            session = load_session(self._existing(session_id), engine)
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
            path = self._existing(session_id)
            header = read_header(path)
            read_saved_session(header, str(path))  # never rewrite a file that does not pass
            header["title"] = " ".join(title.split())
            rewrite_header(path, encode_header(header))  # the payload is checked as it is copied
        return self.info(session_id)

    def delete(self, session_id: str) -> None:
        """Remove a stored session's file (and its lock files); one open here is released."""
        self._existing(session_id)
        with self._held.changing(session_id, "delete"):
            path = self._existing(session_id)
            try:
                path.unlink()
            except OSError as error:
                raise SessionFileError(f"Cannot delete {path}: {error.strerror or error}.") from error
        self.release(session_id)

    def export_markdown(self, session: str | ChatSession) -> str:
        """A Markdown transcript of a stored session (by id) or of a live ``ChatSession``."""
        if not isinstance(session, str):
            return transcript_markdown(session.display_title(), session.history,
                                       model=session.engine.model_name or "")
        path = self._existing(session)
        saved = read_saved_session(read_header(path), str(path))
        messages = ([Message("system", saved.system)] if saved.system else []) + list(saved.history)
        return transcript_markdown(_title(saved), messages, model=_model(saved), updated=saved.updated)

    # internals ------------------------------------------------------------------------------

    def _file(self, session_id: str) -> Path:
        return self.root / f"{session_id}{SUFFIX}"

    def _existing(self, session_id: str) -> Path:
        path = self.path_for(session_id)
        if not path.is_file():
            raise SessionNotFoundError(f"There is no session {session_id!r} in {self.root} "
                                       "(see `mlxchat sessions ls`).")
        return path

    def _remove_stale_temps(self, path: Path) -> None:
        """Delete what a save killed half way left behind (an hour old: no save takes that long)."""
        for temp in self.root.glob(f".{path.name}.*.tmp"):
            if _mtime(temp) < time.time() - STALE_SECONDS:
                temp.unlink(missing_ok=True)

    def _info(self, session_id: str, path: Path) -> SessionInfo:
        elsewhere = session_id not in self._held and is_open(path)
        try:
            saved = read_saved_session(read_header(path), str(path))
        except SessionFileError as error:
            return SessionInfo(session_id, session_id, path, _mtime(path), 0, "", broken=str(error),
                               open_elsewhere=elsewhere)
        return SessionInfo(session_id, _title(saved), path, saved.updated, len(saved.history), _model(saved),
                           open_elsewhere=elsewhere)


def _fresh_id() -> str:
    """The time (so ids sort by creation) and a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def _chat_name(path: Path) -> str:
    """How a message names a stored chat: its title and id."""
    session_id = path.name[: -len(SUFFIX)]
    try:
        return f"Chat {_title(read_saved_session(read_header(path), str(path)))!r} ({session_id})"
    except SessionFileError:
        return f"Chat {session_id}"


def _title(saved: SavedSession) -> str:
    from sessions.chat_session import ChatSession

    # The same rule a live session shows (title, else the first user message): it reads only these two.
    return ChatSession.display_title(SimpleNamespace(title=saved.title, messages=list(saved.history)))


def _model(saved: SavedSession) -> str:
    return saved.model_name or saved.model_fingerprint


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
