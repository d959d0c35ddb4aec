"""The command line's words for the settings that core errors name.

``mlxcore`` speaks its own API in its messages (``kind="rotating"``, ``max_kv``, ``kv_bits=8``,
``num_draft``), so that a Python caller reads the parameters it passes; where ``mlxchat`` shows such a
message (the terminal, the window, the server's error bodies) ``in_flags`` words it as the flags a user
of the command gives instead (``--kv rotating``, ``--max-kv``, ``--kv-bits 8``, ``--num-draft``).
"""

from __future__ import annotations

import re

_RULES = (
    (re.compile(r'\bkind="(paged|rotating|standard)"'), r"--kv \1"),
    (re.compile(r"\bkv_bits=(\d+)"), r"--kv-bits \1"),
    (re.compile(r"\bkv_bits\b"), "--kv-bits"),
    (re.compile(r"\bmax_kv\b"), "--max-kv"),
    (re.compile(r"\bnum_draft\b"), "--num-draft"),
)


def in_flags(text: str) -> str:
    """``text`` with the API's setting names as ``mlxchat``'s flags."""
    for pattern, flag in _RULES:
        text = pattern.sub(flag, text)
    return text
