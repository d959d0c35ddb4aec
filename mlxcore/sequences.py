"""Small helpers on sequences of tokens or characters (no MLX, so the UI process can use them too)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence, b: Sequence) -> int:
    """How many leading items ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag`` (held back: the next text tells)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
