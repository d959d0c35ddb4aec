"""Greedy draft acceptance, computed from teacher-forced draft predictions.

At temperature 0 a drafted token is accepted exactly when it equals the target's greedy
token, and a drafted run is only looked at while every earlier token matched, i.e. while
the draft was fed the target's own tokens. So one forward pass of the draft over
prompt + target reply gives every acceptance decision speculative decoding would make.
"""

from __future__ import annotations

from recipe.decode import argmax_along


def matches(draft, prompt: list[int], reply: list[int]) -> list[bool]:
    """For each reply token: does the draft, given everything before it, predict it?"""
    predicted = argmax_along(draft, prompt + reply)[len(prompt) - 1: -1]
    return [p == t for p, t in zip(predicted, reply)]


def speculative_counts(hits: list[bool], k: int) -> tuple[int, int]:
    """(accepted, proposed) draft tokens for greedy speculative decoding with k drafted per round."""
    accepted = proposed = 0
    i = 0
    while i < len(hits):
        run = min(k, len(hits) - i)
        n = 0
        while n < run and hits[i + n]:
            n += 1
        accepted, proposed = accepted + n, proposed + run
        i += n + 1  # the target adds one token of its own: the correction or the bonus
    return accepted, proposed


def acceptance(draft, rows: list[dict]) -> dict:
    """Per-token acceptance and speculative acceptance for k = 2 and 4, over all replies."""
    per_reply = [matches(draft, r["prompt"], r["reply"]) for r in rows]
    flat = [h for hits in per_reply for h in hits]
    out = {"per-token (alpha)": sum(flat) / len(flat)}
    for k in (2, 4):
        counts = [speculative_counts(hits, k) for hits in per_reply]
        accepted, proposed = sum(a for a, _ in counts), sum(p for _, p in counts)
        out[f"speculative, k={k}"] = accepted / proposed
    return out
