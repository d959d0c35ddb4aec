"""Errors of session files and the session store."""

from mlxcore import MlxchatError


class SessionFileError(MlxchatError):
    """A session file cannot be read or written: it says which file and what is wrong.

    Raised before anything changes: a session being loaded is not built, the
    file being read is left as it was.
    """


class SessionSaveError(SessionFileError):
    """A session could not be written; the file that was there before is intact (writes are atomic)."""


class SessionNotFoundError(MlxchatError):
    """The session store holds no session with the id asked for."""


class SessionInUseError(MlxchatError):
    """Another mlxchat process has the chat open (or is changing it): it says what to do instead."""
