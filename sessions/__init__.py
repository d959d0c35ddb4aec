"""Conversations on an Engine: ``ChatSession`` (history, cache reuse, files) and the ``SessionStore``.

``from sessions import ChatSession``: the names load on first use, so that the
chat window's process can import the pure parts (errors, locks, salvage) without MLX.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy names are, for type checkers (``__getattr__`` loads them)
    from sessions.chat_session import ChatSession as ChatSession
    from sessions.errors import (SessionFileError as SessionFileError, SessionInUseError as SessionInUseError,
        SessionNotFoundError as SessionNotFoundError, SessionSaveError as SessionSaveError)
    from sessions.file_format import cannot_write_text as cannot_write_text
    from sessions.messages import Message as Message
    from sessions.reply import Reply as Reply
    from sessions.salvage import save_history as save_history
    from sessions.store import (SUFFIX as SUFFIX, SessionInfo as SessionInfo, SessionStore as SessionStore,
        default_root as default_root)
    from sessions.store_lock import SessionLock as SessionLock
    from sessions.terminal_text import printable as printable
    from sessions.thinking import ThinkingSplitter as ThinkingSplitter
    from sessions.tools import function_tool as function_tool

_EXPORTS = {
    "ChatSession": "sessions.chat_session",
    "SessionFileError": "sessions.errors", "SessionInUseError": "sessions.errors",
    "SessionNotFoundError": "sessions.errors", "SessionSaveError": "sessions.errors",
    "cannot_write_text": "sessions.file_format",
    "Message": "sessions.messages",
    "Reply": "sessions.reply",
    "save_history": "sessions.salvage",
    "SUFFIX": "sessions.store", "SessionInfo": "sessions.store", "SessionStore": "sessions.store",
    "default_root": "sessions.store",
    "SessionLock": "sessions.store_lock",
    "printable": "sessions.terminal_text",
    "ThinkingSplitter": "sessions.thinking",
    "function_tool": "sessions.tools",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the lazy names, listed once above)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sessions' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
