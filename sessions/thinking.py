"""Splits a streamed reply into its thinking (inside <think>...</think>) and its answer."""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass
class ReplyParts:
    thinking: str = ""
    answer: str = ""


class ThinkingSplitter:
    """Feed text deltas; get (thinking delta, answer delta) back, robust to tags split across deltas."""

    def __init__(self) -> None:
        self.parts = ReplyParts()
        self._pending = ""  # text that may be the start of a tag
        self._state = "start"  # "start" (nothing seen yet), "thinking", "gap" (after </think>) or "answer"

    def feed(self, delta: str) -> tuple[str, str]:
        text = self._pending + delta
        self._pending = ""
        thinking, answer = "", ""
        while text:
            if self._state == "gap":  # newlines between </think> and the answer are layout
                text = text.lstrip("\n")
                self._state = "answer" if text else "gap"
                continue
            tag = THINK_OPEN if self._state == "start" else THINK_CLOSE if self._state == "thinking" else None
            if tag is None:
                answer += text
                break
            head = text.lstrip() if self._state == "start" else text
            if self._state == "start" and not head:
                self._pending = text  # only whitespace so far
                break
            if self._state == "start" and not head.startswith(THINK_OPEN):
                if THINK_OPEN.startswith(head):
                    self._pending = text
                    break
                self._state = "answer"
                continue
            if self._state == "start":
                self._state, text = "thinking", head[len(THINK_OPEN):]
                continue
            at = text.find(THINK_CLOSE)
            if at >= 0:
                thinking += text[:at]
                self._state, text = "gap", text[at + len(THINK_CLOSE):]
                continue
            keep = _partial_suffix(text, THINK_CLOSE)
            thinking += text[: len(text) - keep]
            self._pending = text[len(text) - keep:]
            break
        self.parts.thinking += thinking
        self.parts.answer += answer
        return thinking, answer

    def finish(self) -> tuple[str, str]:
        """Flush what was held back waiting for a tag."""
        rest, self._pending = self._pending, ""
        if self._state == "thinking":
            self.parts.thinking += rest
            return rest, ""
        self.parts.answer += rest
        return "", rest


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
