"""How the engine host words an error for the TUI: a dialog title and what to do next."""

from __future__ import annotations

def failure_title(error: Exception) -> str:
    names = {"SessionFileError": "Session file cannot be opened", "ModelLoadError": "Model cannot be loaded",
             "TokenizerMismatchError": "Draft does not fit the model", "PromptError": "Cannot send this",
             "PoolExhaustedError": "Cache memory is full"}
    return names.get(type(error).__name__, "Something went wrong")


_HINTS = {
    "SessionFileError": "A new chat was opened instead. Pick another chat in the sidebar (ctrl+b), "
                        "or delete this one there.",
    "SessionNotFoundError": "Pick a chat from the sidebar (ctrl+b).",
    "PoolExhaustedError": "Start a new chat (ctrl+n), or restart mlxchat with a larger --max-kv.",
    "PromptError": "Start a new chat (ctrl+n) or shorten the message.",
}


def with_hint(error: Exception, fatal: bool) -> str:
    """The error's message and what to do about it in the TUI."""
    name = type(error).__name__
    if fatal:
        hint = "Quit, then check the --model/--draft names (mlxchat --help), or run without --model to use the default."
    elif name == "ModelLoadError" or name == "TokenizerMismatchError":
        hint = "The previous model is still loaded: switch model again (f5) with another name."
    else:
        hint = _HINTS.get(name, "")
    return f"{error}\n\n{hint}" if hint else str(error)
