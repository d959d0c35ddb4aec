"""What a caller asks the batching scheduler for: prompt ids, sampling, priority, deadline."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import TYPE_CHECKING

from mlxcore.grammar import Grammar
from mlxcore.params import GenerationParams

if TYPE_CHECKING:
    from mlxcore.caches import Caches

_ids = itertools.count(1)


class Priority(IntEnum):
    """Served in this order by the priority policy (with aging, so low is never starved)."""

    LOW = 0
    NORMAL = 1
    HIGH = 2

    @classmethod
    def parse(cls, text: str) -> Priority:
        """``"low"``, ``"normal"`` or ``"high"``; ``ValueError`` otherwise."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"priority must be low, normal or high, not {text!r}") from None


@dataclass(frozen=True)
class Request:
    """One reply to generate. Its events are the same as ``Engine.generate``'s."""

    prompt_ids: tuple[int, ...]  # the whole templated prompt; blocks it shares with other requests are reused
    params: GenerationParams = GenerationParams()  # sampling, max_tokens, stop strings, seed: per request
    priority: Priority = Priority.NORMAL
    deadline: float | None = None  # time.monotonic() by which the reply should be done; None = no deadline
    top_logprobs: int = 0  # also report this many likeliest tokens (and log-probabilities) at each position
    use_draft: bool = True  # decode speculatively when it runs alone and the engine has a draft
    grammar: Grammar | None = None  # what the reply must match (after any thinking): JSON schema, tool call
    keep_caches: bool = False  # hand the reply's caches to the caller (``RequestHandle.caches``) at its end
    # Caches to start from (a chat's own): kept up to their common prefix with the prompt, so a turn
    # computes only what is new, to the token. They are the request's then (given back with keep_caches).
    caches: Caches | None = field(default=None, compare=False, repr=False)
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("A request needs at least one prompt token.")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be between 0 and 20, not {self.top_logprobs}")
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))

    def choice(self, index: int) -> Request:
        """Choice ``index`` of ``n`` replies to this prompt: its own request id (the first keeps this one's)."""
        return self if index == 0 else replace(self, request_id=f"{self.request_id}-{index}", caches=None)
