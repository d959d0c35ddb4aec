"""A streamed reply's tool calls, held until the parser has read each whole, for the APIs that stream a call
as one item (Anthropic's ``tool_use`` block, the Responses API's ``function_call`` item).

The chat endpoint sends a call's name as soon as it is read and then its arguments
as generated; a call that then fails to parse leaves a name and half an object
behind (``docs/tools.md``). Anthropic's SDK parses every ``input_json_delta`` as it
comes and raises on JSON that cannot become valid, so these streams send a call
only once it parsed: its pieces as generated, one after the other, at the call's
end. A call that does not parse sends nothing here: its text comes as text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.serve.choices import ChoiceState, Delta
from mlxcore import ToolCall


@dataclass
class CallPieces:
    """Per call (the parser's stream index) the argument pieces so far; ``feed`` gives the calls just done."""

    _pieces: dict[int, list[str]] = field(default_factory=dict)
    _index_of: dict[str, int] = field(default_factory=dict)  # a call's id -> its stream index
    _done: int = 0  # calls of the choice already given

    def feed(self, choice: ChoiceState, delta: Delta) -> list[tuple[ToolCall, list[str]]]:
        """The calls ``delta`` completed, each with its arguments in the pieces they were generated in."""
        for piece in delta.tool_calls:
            if piece.id is not None:
                self._index_of[piece.id] = piece.index
            self._pieces.setdefault(piece.index, []).extend([piece.arguments] if piece.arguments else [])
        done, self._done = choice.tool_calls[self._done:], len(choice.tool_calls)
        return [(call, self._take(call)) for call in done]

    def _take(self, call: ToolCall) -> list[str]:
        pieces = self._pieces.pop(self._index_of.pop(call.id, -1), [])
        # the parser read the whole call again at its end; if that differs from the pieces, the whole wins
        return pieces if "".join(pieces) == call.arguments else [call.arguments]
