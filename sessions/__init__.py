"""Conversations on an Engine: ``ChatSession`` (history, cache reuse, files) and the ``SessionStore``.

``from sessions import ChatSession``: the names load on first use, so that the
chat window's process can import the pure parts (errors, locks, salvage) without MLX.
"""

import importlib

_EXPORTS = {"ChatSession": "sessions.chat_session", "SessionStore": "sessions.store",
            "SessionFileError": "sessions.errors", "Message": "sessions.messages",
            "Reply": "sessions.reply", "function_tool": "sessions.tools"}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the lazy names, listed once above)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sessions' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
