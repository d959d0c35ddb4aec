"""How the engine host words an error for the TUI: a dialog title and what to do next."""

from __future__ import annotations

from app.flags import in_flags

_TITLES = {"SessionSaveError": "Chat not saved", "ModelLoadError": "Model cannot be loaded",
           "TokenizerMismatchError": "Draft does not fit the model", "PromptError": "Cannot send this",
           "PoolExhaustedError": "Cache memory is full", "OverloadedError": "Cache memory is full", "SessionNotFoundError": "No such chat",
           "SessionInUseError": "Chat is open in another window",
           "SystemPromptTooLongError": "System prompt too long",
           "SideBySideError": "Replies side by side need --kv paged"}

_HINTS = {
    "SessionSaveError": "The chat is still here, on screen and in memory. Fix what is said above, then press "
                        "ctrl+s; mlxchat also tries again after the next reply.",
    "SessionNotFoundError": "Pick a chat from the sidebar (ctrl+b).",
    "PoolExhaustedError": "Start a new chat (ctrl+n) or close chats you do not need, or restart mlxchat with "
                          "a larger --max-kv (e.g. --max-kv 8GB).",
    "OverloadedError": "Start a new chat (ctrl+n) or let the chats answering in the background end, or restart "
                       "mlxchat with a larger --max-kv (e.g. --max-kv 8GB).",
    "PromptError": "Start a new chat (ctrl+n) or shorten the message.",
    "SystemPromptTooLongError": "Shorten the system prompt in the settings (f10), or restart mlxchat with a "
                                "larger --max-kv.",
    "SideBySideError": "Send it with Enter for one reply, or restart mlxchat with --kv paged (the default).",
}
_OPEN_HINT = ("A new chat was opened instead. Pick another chat in the sidebar (ctrl+b), "
              "or delete this one there.")


def failure_title(error: Exception, opening: bool = False) -> str:
    """The dialog's title; ``opening``: the error came from opening a chat or a session file."""
    name = _known_name(error)
    if name == "SessionFileError":
        return "Session file cannot be opened" if opening else "Session file problem"
    return _TITLES.get(name, "Something went wrong")


def _known_name(error: Exception) -> str:
    """The name of the nearest class of ``error`` that has its own wording (e.g. PromptError for its kinds)."""
    for kind in type(error).__mro__:
        if kind.__name__ in _TITLES or kind.__name__ in _HINTS or kind.__name__ == "SessionFileError":
            return kind.__name__
    return type(error).__name__


def with_hint(error: Exception, fatal: bool, opening: bool = False) -> str:
    """The error's message and what to do about it in the TUI."""
    name = _known_name(error)
    if fatal:
        hint = "Quit, then check the --model/--draft names (mlxchat --help), or run without --model to use the default."
    elif name == "ModelLoadError" or name == "TokenizerMismatchError":
        hint = "The previous model is still loaded: switch model again (f5) with another name."
    elif name == "SessionFileError" and opening:
        hint = _OPEN_HINT
    else:
        hint = _HINTS.get(name, "")
    text = in_flags(str(error))  # (the window's user gives flags, not the API's parameters)
    return f"{text}\n\n{hint}" if hint else text
