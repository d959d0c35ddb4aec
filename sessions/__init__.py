"""Conversations on an Engine: ``ChatSession`` (history, cache reuse, files) and the ``SessionStore``.

``from sessions import ChatSession``: the names load on first use, so that the
chat window's process can import the pure parts (errors, locks, salvage) without MLX.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy names are, for type checkers (``__getattr__`` loads them)
    from sessions.chat_session import ChatSession as ChatSession
    from sessions.errors import SessionFileError as SessionFileError
    from sessions.messages import Message as Message
    from sessions.reply import Reply as Reply
    from sessions.store import SessionStore as SessionStore
    from sessions.tools import function_tool as function_tool

_EXPORTS = {"ChatSession": "sessions.chat_session", "SessionStore": "sessions.store",
            "SessionFileError": "sessions.errors", "Message": "sessions.messages",
            "Reply": "sessions.reply", "function_tool": "sessions.tools"}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the lazy names, listed once above)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sessions' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
