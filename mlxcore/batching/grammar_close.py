"""A short way from a grammar matcher's state to a complete reply, to close a constrained reply before its
token cap.

``closing_path`` plays the matcher forward on a copy, without the model: at each
step the first of ``CLOSERS`` the grammar allows (a closing brace, bracket or
quote, a ``0``) that changes what may follow, else the allowed token with the
lowest id (in Qwen3's vocabulary, as in most byte-level ones, the single
characters come first), until the grammar is complete. Not always the very
shortest reply, but one the reply can be held to: ``Constraint`` forces it,
token by token, once what is left of ``max_tokens`` comes near its length
(``Closing``); a reply still thinking then closes its block first.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llguidance import LLMatcher
    from mlx_lm.tokenizer_utils import TokenizerWrapper

CLOSERS = ("}", "]", '"', "0")  # preferred where allowed and where they change what follows: each ends what
# is open (``0``: the shortest number)
MARGIN = 24  # tokens left beyond the closing path when it is forced: what one free token may add to it
GROWTH = 8  # what one free token is assumed to add to the path at most, between two measures of it


@lru_cache(maxsize=4)
def closer_ids(tokenizer: TokenizerWrapper) -> tuple[int, ...]:
    """The token ids of ``CLOSERS`` that are one token in ``tokenizer``."""
    found = (tokenizer.encode(text, add_special_tokens=False) for text in CLOSERS)
    return tuple(ids[0] for ids in found if len(ids) == 1)


def shortest_reply(matcher: LLMatcher, tokenizer: TokenizerWrapper, limit: int) -> int | None:
    """Tokens of the short complete reply ``closing_path`` finds from ``matcher``'s state (its end-of-text token
    included), if at most ``limit``; else None. ``serve`` refuses a ``max_tokens`` below it."""
    path = closing_path(matcher, closer_ids(tokenizer), limit - 1)
    return None if path is None else len(path) + 1


def closing_path(matcher: LLMatcher, closers: tuple[int, ...], limit: int) -> list[int] | None:
    """The tokens that take ``matcher`` (left as it is) to a complete reply, at most ``limit`` of them; None
    if there are more (or the grammar cannot complete)."""
    state, path = matcher.deep_copy(), list[int]()
    mask = state.compute_bitmask()
    while not state.is_accepting():
        if len(path) >= limit or state.is_stopped() or state.is_error():
            return None
        step = _closer(state, mask, closers) or _lowest(state, mask)
        if step is None:
            return None
        token, state, mask = step
        path.append(token)
    return path


def _closer(state: LLMatcher, mask: bytes, closers: tuple[int, ...]) -> tuple[int, LLMatcher, bytes] | None:
    """The first of ``closers`` allowed that changes what may follow (inside a string, ``}`` is a character
    like any other: the mask after it is the same); the state and mask after it."""
    words = np.frombuffer(mask, dtype=np.uint32)
    for token in closers:
        if token // 32 < words.size and words[token // 32] >> (token % 32) & 1:
            after = state.deep_copy()
            if after.consume_token(token):
                after_mask = after.compute_bitmask()
                if after.is_accepting() or after_mask != mask:
                    return token, after, after_mask
    return None


def _lowest(state: LLMatcher, mask: bytes) -> tuple[int, LLMatcher, bytes] | None:
    """The allowed token with the lowest id, consumed by ``state``; the mask after it."""
    words = np.frombuffer(mask, dtype=np.uint32)
    nonzero = np.flatnonzero(words)
    if not nonzero.size:
        return None
    word = int(words[nonzero[0]])
    token = int(nonzero[0]) * 32 + (word & -word).bit_length() - 1
    return (token, state, state.compute_bitmask()) if state.consume_token(token) else None


class Closing:
    """When a reply under a grammar must start closing, and how: ``token(count, matcher)`` is the token the
    grammar forces at reply position ``count`` (None: the model chooses). ``budget``: the reply's token cap.

    The path is measured now and then (each ``GROWTH`` tokens it may grow by one measure), every token near
    the end; once ``MARGIN`` tokens or fewer are left beyond it (its end-of-text token included), it is
    forced. A grammar whose shortest reply does not fit the budget from the start is left alone (``serve``
    refuses such a request up front)."""

    def __init__(self, budget: int, closers: tuple[int, ...], eos: int) -> None:
        self.budget, self.closers, self.eos = budget, closers, eos
        self.forced: dict[int, int] = {}  # reply position -> the token forced there (the path, then eos)
        self.start = -1  # where the forced path begins (-1: not forced)
        self.next_check = 0  # the reply position of the next measure
        self.measured = False  # measured once (a path that does not fit then never will: nothing to do)
        self.off = False
        self.answer = 0  # tokens of the shortest answer from the grammar's start (0: not measured yet)

    def token(self, count: int, matcher: LLMatcher) -> int | None:
        """The token forced at reply position ``count`` (``matcher``'s state there), or None."""
        if self.off:
            return None
        if self.start >= 0:
            return self.forced.get(count)
        if count < self.next_check:
            return None
        left = self.budget - count  # tokens the reply may still take, this one included
        path = closing_path(matcher, self.closers, max(left - 1, 0))
        if path is None:
            self.off = not self.measured  # from the start: it cannot fit at all
            self.measured, self.next_check = True, count + 1
            return None
        self.measured = True
        slack = left - (len(path) + 1)
        if slack > MARGIN:
            self.next_check = count + max(1, (slack - MARGIN) // (GROWTH + 1))
            return None
        self.start, self.forced = count, dict(enumerate([*path, self.eos], count))
        return self.forced.get(count)

    def stop_thinking(self, count: int, matcher: LLMatcher) -> bool:
        """Whether a reply still thinking at position ``count`` must close its block now (``matcher``: the
        grammar's start, untouched while thinking) to leave room for the answer and the margin."""
        if not self.answer:
            path = closing_path(matcher, self.closers, self.budget)
            self.answer = -1 if path is None else len(path) + 1
        return self.answer > 0 and self.budget - count <= self.answer + 1 + MARGIN

    def rolled_back(self, count: int) -> None:
        """The reply is back to ``count`` tokens (a speculative round's guesses undone): a path measured after
        them no longer holds."""
        if 0 <= count < self.start:
            self.start, self.forced = -1, {}
