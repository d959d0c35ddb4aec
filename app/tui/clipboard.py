"""Copying text where the user can paste it: the platform's clipboard command on this machine, OSC 52 over SSH.

Textual only writes OSC 52, which Terminal.app ignores and iTerm2 takes only when allowed, so a copy that says
"Copied" must have gone through a command that reports success: pbcopy on macOS, wl-copy or xclip on Linux. Over
SSH those would fill the remote machine's clipboard, so there the escape sequence goes to the user's terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

COMMAND_TIMEOUT_S = 2.0
PLATFORM = sys.platform  # (tests play a Mac here)
_SSH = ("SSH_TTY", "SSH_CONNECTION", "SSH_CLIENT")


@dataclass(frozen=True)
class Copied:
    """How a copy went: ``by`` the command's name, "OSC 52", or "" when nothing was copied; ``done`` only when a
    command said it copied."""

    by: str
    done: bool
    why: str = ""  # when nothing was copied, or a command failed


def over_ssh() -> bool:
    return any(os.environ.get(name) for name in _SSH)


def clipboard_command() -> list[str] | None:
    """The command that takes text on stdin into this machine's clipboard, if one is installed."""
    candidates: list[list[str]] = []
    if PLATFORM == "darwin":
        candidates.append(["pbcopy"])
    else:
        if os.environ.get("WAYLAND_DISPLAY"):
            candidates.append(["wl-copy"])
        if os.environ.get("DISPLAY"):
            candidates.append(["xclip", "-selection", "clipboard"])
    return next((c for c in candidates if shutil.which(c[0])), None)


def copy_text(text: str, osc52: Callable[[str], None]) -> Copied:
    """Put ``text`` in the clipboard: the platform command when not over SSH, else ``osc52(text)``."""
    command = None if over_ssh() else clipboard_command()
    if command is not None:
        try:
            done = subprocess.run(command, input=text.encode(), env={**os.environ, "LC_CTYPE": "UTF-8"},
                                  capture_output=True, timeout=COMMAND_TIMEOUT_S)
            if done.returncode == 0:
                return Copied(command[0], True)
            why = f"{command[0]} failed ({done.stderr.decode(errors='replace').strip() or done.returncode})"
        except (OSError, subprocess.TimeoutExpired) as error:
            why = f"{command[0]} failed ({error})"
        osc52(text)
        return Copied("OSC 52", False, why)
    if os.environ.get("TERM_PROGRAM") == "Apple_Terminal" and not over_ssh():
        return Copied("", False, "Terminal.app ignores OSC 52 and pbcopy is not on PATH")
    osc52(text)
    return Copied("OSC 52", False)


def copy_notice(copied: Copied, what: str, length: int) -> tuple[str, bool]:
    """(the line to show, whether it is a warning) for a copy of ``what``."""
    if copied.done:
        return f"Copied {what} ({length} characters) with {copied.by}.", False
    if not copied.by:
        return f"Nothing was copied: {copied.why}. Select the text with the mouse (fn or Option held) instead.", True
    failed = f"{copied.why}; " if copied.why else ""
    return (f"{failed}sent {what} ({length} characters) to the terminal by OSC 52: it is in the clipboard if your "
            "terminal allows that (iTerm2: Settings > General > Selection).", bool(copied.why))
