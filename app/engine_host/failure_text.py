"""How the engine host tells the UI about an error: a Failure event with its code, a title and what to do next.

The code is what the UI acts on; the title and the message are for the user. An
error's code is that of the nearest class in its ancestry that has one of its own.
"""

from __future__ import annotations

import traceback

from app.engine_host import protocol as p
from app.engine_host.protocol import FailureCode as Code
from app.flags import in_flags
from mlxcore import (MlxchatError, ModelLoadError, OverloadedError, PoolExhaustedError, PromptError,
                     SystemPromptTooLongError, TokenizerMismatchError)
from sessions import SessionFileError, SessionInUseError, SessionNotFoundError, SessionSaveError


class SideBySideError(PromptError):
    """Several replies at once were asked for on a KV cache that is not paged (the scheduler needs it)."""


_CODES: dict[type[BaseException], Code] = {
    SideBySideError: Code.SIDE_BY_SIDE, SystemPromptTooLongError: Code.SYSTEM_PROMPT_TOO_LONG,
    PromptError: Code.PROMPT, ModelLoadError: Code.MODEL_LOAD, SessionFileError: Code.SESSION_FILE,
    TokenizerMismatchError: Code.DRAFT_MISMATCH, PoolExhaustedError: Code.CACHE_FULL,
    OverloadedError: Code.OVERLOADED, SessionNotFoundError: Code.NOT_FOUND, SessionInUseError: Code.IN_USE,
    SessionSaveError: Code.NOT_SAVED,
}

_TITLES = {
    Code.UNEXPECTED: "Unexpected error", Code.NOT_SAVED: "Chat not saved", Code.MODEL_LOAD: "Model cannot be loaded",
    Code.DRAFT_MISMATCH: "Draft does not fit the model", Code.PROMPT: "Cannot send this",
    Code.CACHE_FULL: "Cache memory is full", Code.OVERLOADED: "Cache memory is full", Code.NOT_FOUND: "No such chat",
    Code.IN_USE: "Chat is open in another window", Code.SYSTEM_PROMPT_TOO_LONG: "System prompt too long",
    Code.SIDE_BY_SIDE: "Replies side by side need --kv paged",
}

_HINTS = {
    Code.NOT_SAVED: "The chat is still here, on screen and in memory. Fix what is said above, then press "
                    "ctrl+s; mlxchat also tries again after the next reply.",
    Code.NOT_FOUND: "Pick a chat from the sidebar (ctrl+b).",
    Code.CACHE_FULL: "Start a new chat (ctrl+n) or close chats you do not need, or restart mlxchat with "
                     "a larger --max-kv (e.g. --max-kv 8GB).",
    Code.OVERLOADED: "Start a new chat (ctrl+n) or let the chats answering in the background end, or restart "
                     "mlxchat with a larger --max-kv (e.g. --max-kv 8GB).",
    Code.PROMPT: "Start a new chat (ctrl+n) or shorten the message.",
    Code.SYSTEM_PROMPT_TOO_LONG: "Shorten the system prompt in the settings (ctrl+y, f10), or restart mlxchat with a "
                                 "larger --max-kv.",
    Code.SIDE_BY_SIDE: "Send it with Enter for one reply, or restart mlxchat with --kv paged (the default).",
}
_FATAL_HINT = "Quit, then check the --model/--draft names (mlxchat --help), or run without --model to use the default."
_SWITCH_HINT = "The previous model is still loaded: switch model again (f5, alt+m) with another name."
_OPEN_HINT = "A new chat was opened instead. Pick another chat in the sidebar (ctrl+b), or delete this one there."


def failure_code(error: BaseException) -> Code:
    """The kind of ``error``: that of the nearest class of its ancestry that has one; UNEXPECTED for a bug."""
    for kind in type(error).__mro__:
        code = _CODES.get(kind)
        if code is not None:
            return code
    return Code.ERROR if isinstance(error, MlxchatError) else Code.UNEXPECTED


def failure_title(error: BaseException, opening: bool = False) -> str:
    """The dialog's title; ``opening``: the error came from opening a chat or a session file."""
    code = failure_code(error)
    if code is Code.SESSION_FILE:
        return "Session file cannot be opened" if opening else "Session file problem"
    return _TITLES.get(code, "Something went wrong")


def with_hint(error: BaseException, fatal: bool, opening: bool = False) -> str:
    """The error's message and what to do about it in the TUI."""
    code = failure_code(error)
    if fatal:
        hint = _FATAL_HINT
    elif code in (Code.MODEL_LOAD, Code.DRAFT_MISMATCH):
        hint = _SWITCH_HINT
    elif code is Code.SESSION_FILE and opening:
        hint = _OPEN_HINT
    else:
        hint = _HINTS.get(code, "")
    text = in_flags(str(error))  # (the window's user gives flags, not the API's parameters)
    return f"{text}\n\n{hint}" if hint else text


def failure_event(error: BaseException, loaded: bool, command: p.Command | None = None) -> p.Failure:
    """The Failure that tells the user about ``error``, raised by ``command`` (if one); ``loaded``: a model is
    in use (a failure before one is fatal when it comes from opening, or from a bug)."""
    code = failure_code(error)
    if code is Code.UNEXPECTED:
        trace = "".join(traceback.format_exception(error, limit=4))
        return p.Failure(_TITLES[code], f"{type(error).__name__}: {error}\n\n{trace}", fatal=not loaded, code=code)
    fatal = not loaded and isinstance(command, p.Open)
    opening = isinstance(command, (p.Open, p.OpenSession))
    refused = command.text if isinstance(error, PromptError) and isinstance(command, (p.Send, p.EditLast)) else None
    return p.Failure(failure_title(error, opening), with_hint(error, fatal, opening), fatal=fatal,
                     returned_text=refused, code=code)
