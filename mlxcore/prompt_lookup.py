"""Prompt lookup: draft tokens found in the sequence's own text, no draft model.

Where a reply repeats its context (an edited file written out again, a quoted document, an agent's
tool call naming what it read), the tokens after the reply's last few tokens are most likely the
tokens that followed the same few tokens before. ``NgramIndex`` keeps, for each n-gram of the
sequence (prompt and reply so far), where it last ended; a proposal is the continuation of the
longest n-gram (``MAX_NGRAM`` down to ``MIN_NGRAM`` tokens) that ends the sequence and occurred
before, its latest occurrence first. A one-token match proposes on nearly every step of ordinary
text and is seldom right, so matches start at two tokens. The index grows with the sequence: one
dictionary entry per position and n.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 4
MIN_NGRAM = 2


class NgramIndex:
    """Where each n-gram of one sequence last ended (see the module docstring)."""

    def __init__(self) -> None:
        self.sizes = range(MAX_NGRAM, MIN_NGRAM - 1, -1)
        self.ends: dict[tuple[int, ...], int] = {}  # an n-gram -> the position right after its latest occurrence
        self.indexed = 0  # the n-grams ending before this position are in ``ends``

    def propose(self, ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest earlier occurrence of the n-gram ending ``ids``
        (none when no such n-gram occurred before)."""
        self._index(ids)
        for n in self.sizes:
            if n > len(ids):
                continue
            end = self.ends.get(tuple(ids[len(ids) - n:]))
            if end is not None:
                return list(ids[end:end + k])
        return []

    def _index(self, ids: Sequence[int]) -> None:
        """Take in the n-grams that end before the last position (the last one's is what is looked up)."""
        if len(ids) < self.indexed:  # the sequence was rewound past what was indexed: start again
            self.ends.clear()
            self.indexed = 0
        for end in range(max(self.indexed, 1), len(ids)):
            for n in self.sizes:
                if n <= end:
                    self.ends[tuple(ids[end - n:end])] = end
        self.indexed = max(self.indexed, len(ids))
