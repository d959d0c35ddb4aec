"""Tool results cut to fit the context, so that a tool that answers with a megabyte does not break the chat.

A result is text from outside (an MCP server, a function): nothing bounds its size. The
conversation with the results must leave the model room to answer and go on, or the turn
would be refused as too long, blaming the user. So one turn's results take at most half of
the context the conversation leaves free; results that would take more are cut (the longest
lose most), each cut one ending with a note the model reads (``[cut: N characters]``); a
result with no room at all becomes a tool error that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

NOTE_ROOM = 16  # tokens a cut result's note takes, about
MAX_ROUNDS = 4  # cuts tried before giving up (each measures the prompt again: a cut changes tokenization a little)


def cut_note(removed: int) -> str:
    return f"\n[cut: {removed} characters]"


def fitted_results(results: Sequence[str], limit: int | None, prompt_tokens: Callable[[list[str]], int],
                   encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]) -> list[str]:
    """``results`` cut so that they take at most half of the ``limit`` tokens that the prompt without them
    (``prompt_tokens`` of empty results) leaves free (None: no limit known, nothing cut)."""
    kept = list(results)
    if limit is None:
        return kept
    base = prompt_tokens([""] * len(results))
    room = base + max(limit - base, 0) // 2
    ids: list[list[int]] | None = None  # each result's tokens, once one must be cut
    counts: list[int] = []  # the tokens of each result kept
    for _ in range(MAX_ROUNDS):
        over = prompt_tokens(kept) - room
        if over <= 0:
            return kept
        if ids is None:  # the first cut: each cut result gets a note
            ids = [encode(result) for result in results]
            counts = [len(i) for i in ids]
            over += NOTE_ROOM * len(results)
        counts = _shares(counts, sum(counts) - over)
        kept = [result if count >= len(i) else _cut(result, i, count, decode)
                for result, i, count in zip(results, ids, counts)]
    return [_too_large(result) for result in results]


def _shares(sizes: list[int], total: int) -> list[int]:
    """Tokens each result keeps, ``total`` in all: the longest cut first, down to a common length."""
    if total <= 0:
        return [0] * len(sizes)
    shares = list(sizes)
    while sum(shares) > total:
        top = max(shares)
        longest = [k for k, share in enumerate(shares) if share == top]
        lower = max([share for share in shares if share < top], default=0)
        excess = sum(shares) - total
        level = max(lower, top - -(-excess // len(longest)))
        for k in longest:
            shares[k] = level
    return shares


def _cut(result: str, ids: list[int], count: int, decode: Callable[[list[int]], str]) -> str:
    """The first ``count`` tokens of ``result`` and the note (none left: the tool error instead)."""
    if count <= 0:
        return _too_large(result)
    text = decode(ids[:count])
    return text + cut_note(len(result) - len(text))


def _too_large(result: str) -> str:
    return f"Error: the result ({len(result)} characters) was too large for the context, and was not kept."
