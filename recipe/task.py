"""One checkable question and its answer, in the two forms the models learn."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """A question with a known answer.

    ``thought`` is the reasoning written inside ``<think>`` when thinking is on;
    ``steps`` are the brief worked steps shown before the answer when it is off.
    """

    group: str     # task type the evaluation reports: arithmetic, string, ...
    key: tuple     # what makes two tasks the same instance (the held-out split uses it)
    user: str      # the question as the user writes it
    thought: str   # reasoning for thinking-on replies
    steps: str     # worked steps for thinking-off replies ('' for none)
    answer: str    # the final line of the reply, checked by exact match
    open_key: bool = True  # False: few instances exist, so the split keys on the exact wording

    def visible(self, thinking: bool) -> str:
        """The reply text after the think block."""
        if thinking or not self.steps:
            return self.answer
        return f"{self.steps}\n{self.answer}"


def pick(rng: random.Random, options: list[str]) -> str:
    return options[rng.randrange(len(options))]
