"""A reply's thinking and answer, as the one reply parser splits them (``mlxcore.reply_parser``), without tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlxcore import ReplyParser

if TYPE_CHECKING:
    from mlxcore import ParsedDelta


@dataclass
class ReplyParts:
    thinking: str = ""
    answer: str = ""


class ThinkingSplitter:
    """Feed text deltas; get (thinking delta, answer delta) back, robust to tags split across deltas."""

    def __init__(self) -> None:
        self.parts = ReplyParts()
        self._parser = ReplyParser()

    def feed(self, delta: str) -> tuple[str, str]:
        return self._keep(self._parser.feed(delta))

    def finish(self) -> tuple[str, str]:
        """Flush what was held back waiting for a tag."""
        return self._keep(self._parser.finish())

    def _keep(self, parsed: ParsedDelta) -> tuple[str, str]:
        self.parts.thinking += parsed.reasoning
        self.parts.answer += parsed.content
        return parsed.reasoning, parsed.content
