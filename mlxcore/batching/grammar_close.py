"""A short way from a grammar matcher's state to a complete reply, to close a constrained reply before its
token cap: ``closing_path`` plays the matcher forward on a copy, without the model, and ``Constraint`` forces
that path once what is left of ``max_tokens`` comes near its length (``Closing``). The rules and the margin:
docs/structured_output.md, "A reply closes before max_tokens".
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
SHORTEST_KEPT = 64  # grammars whose shortest reply is kept
_shortest: dict[tuple[str, int], tuple[int, int | None]] = {}  # (grammar, tokenizer) -> (limit, its tokens)


@lru_cache(maxsize=4)
def closer_ids(tokenizer: TokenizerWrapper) -> tuple[int, ...]:
    """The token ids of ``CLOSERS`` that are one token in ``tokenizer``."""
    found = (tokenizer.encode(text, add_special_tokens=False) for text in CLOSERS)
    return tuple(ids[0] for ids in found if len(ids) == 1)


def shortest_reply(grammar: str, tokenizer: TokenizerWrapper, matcher: LLMatcher, limit: int) -> int | None:
    """Tokens of the short complete reply ``closing_path`` finds from ``matcher``'s state, the start of
    ``grammar`` (llguidance's text), its end-of-text token included, if at most ``limit``; else None. Kept per
    grammar and tokenizer: every reply to a grammar starts from the same state. ``serve`` refuses a
    ``max_tokens`` below it."""
    key = (grammar, id(tokenizer))
    measured, found = _shortest.get(key, (-1, None))
    if found is None and measured < limit:
        path = closing_path(matcher, closer_ids(tokenizer), limit - 1)
        found = None if path is None else len(path) + 1
        if len(_shortest) >= SHORTEST_KEPT:
            _shortest.clear()
        _shortest[key] = (limit, found)
    return found if found is not None and found <= limit else None


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
    like any other: the mask after it is the same), consumed by ``state``; the mask after it."""
    words = np.frombuffer(mask, dtype=np.uint32)
    for token in closers:
        if token // 32 < words.size and words[token // 32] >> (token % 32) & 1 and state.consume_token(token):
            after = state.compute_bitmask()
            if state.is_accepting() or after != mask:
                return token, state, after
            state.rollback(1)
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

    def __init__(self, budget: int, closers: tuple[int, ...], eos: int, answer: int | None) -> None:
        """``answer``: ``shortest_reply`` from the grammar's start (None: it does not fit ``budget``)."""
        self.budget, self.closers, self.eos, self.answer = budget, closers, eos, answer
        self.forced: dict[int, int] = {}  # reply position -> the token forced there (the path, then eos)
        self.start = -1  # where the forced path begins (-1: not forced)
        self.next_check = 0  # the reply position of the next measure
        self.off = answer is None  # it cannot fit (or no longer does): nothing to do

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
        if path is None:  # too late (a token added more than the margin): the cap cuts it
            self.off = True
            return None
        slack = left - (len(path) + 1)
        if slack > MARGIN:
            self.next_check = count + max(1, (slack - MARGIN) // (GROWTH + 1))
            return None
        self.start, self.forced = count, dict(enumerate([*path, self.eos], count))
        return self.forced.get(count)

    def stop_thinking(self, count: int) -> bool:
        """Whether a reply still thinking at position ``count`` must close its block now, to leave room for
        the answer and the margin."""
        return self.answer is not None and self.budget - count <= self.answer + 1 + MARGIN

    def rolled_back(self, count: int) -> None:
        """The reply is back to ``count`` tokens (a speculative round's guesses undone): a path measured after
        them no longer holds."""
        if 0 <= count < self.start:
            self.start, self.forced = -1, {}
