"""Text from outside (session files, HTTP clients) made safe to print on a terminal.

A title or a model name read from a file may hold what a terminal acts on instead of
showing: escape sequences (ESC; OSC 52 writes the clipboard), BEL, C1 controls, a
carriage return that overwrites the line, bidi overrides that reorder it. The CLI prints
such text through ``printable`` only; the files and the store keep it as it was.
"""

from __future__ import annotations

import unicodedata

SHOWN_LENGTH = 80  # a title or model name longer than this is cut for display
HIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}  # controls, format (bidi) characters, lone surrogates, line separators
JOINERS = {"\u200c", "\u200d"}  # format characters that only join glyphs (emoji sequences, Indic scripts)


def printable(text: str, limit: int | None = SHOWN_LENGTH, keep: str = "") -> str:
    """``text`` with every character a terminal would act on made visible: C0 controls and DEL in caret
    notation (ESC -> ``^[``), the others as U+FFFD; ``keep``: characters left as they are (e.g. newlines).
    Cut to ``limit`` characters (None: no cut), an ellipsis marking the cut."""
    shown = "".join(_visible(char, keep) for char in text)
    if limit is not None and len(shown) > limit:
        return shown[: limit - 1] + "…"
    return shown


def _visible(char: str, keep: str) -> str:
    if char in keep or char in JOINERS:
        return char
    code = ord(char)
    if code < 0x20 or code == 0x7F:
        return "^" + chr(code ^ 0x40)
    return "\ufffd" if unicodedata.category(char) in HIDDEN else char
