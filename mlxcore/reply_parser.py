"""One streaming parser for a reply: its reasoning (``<think>``), its text, and its tool calls (``<tool_call>``).

Fed the reply's text deltas as they are generated, it returns what each adds, split three ways in one pass
(so a call begun inside an unclosed ``<think>`` is a call, not thinking). A call that cannot be read becomes
text, never dropped (``broken``: those whose name went out already); without ``tools``, ``<tool_call>`` is
text. Its states, what is held back, and how a call goes out in pieces: docs/tools.md, "The parser".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from mlxcore.sequences import partial_suffix
from mlxcore.think_blocks import CLOSE, OPEN
from mlxcore.tool_calls import (CALL_CLOSE, CALL_OPEN, JSON_HEAD, XML_FUNCTION, XML_PARAMETER, ObjectScan, ToolCall,
                                ToolCallError, new_call_id, parse_call, tool_names, typed_value)

log = logging.getLogger("mlxchat.tools")


@dataclass(frozen=True)
class CallDelta:
    """What one delta adds to call ``index``: its id and name come once, first; then arguments text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ParsedDelta:
    reasoning: str = ""
    content: str = ""
    calls: tuple[CallDelta, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.calls)


class ReplyParser:
    """See the module docstring. ``reasoning``, ``content`` and ``calls`` hold the sums so far."""

    def __init__(self, tools: Sequence[dict] | None = None) -> None:
        self.with_tools = tools is not None
        self.schemas = tool_names(tools or ())
        self.reasoning = ""
        self.content = ""
        self.calls: list[ToolCall] = []
        self.broken: list[int] = []  # stream indices of calls whose name went out but that then did not parse
        self._state = "start"  # "start" (nothing yet), "thinking", "gap" (after </think>), "answer" or "call"
        self._pending = ""  # text that may begin a tag
        self._call: _CallStream | None = None
        self._announced = 0  # calls whose name went out (indices of the stream)
        self._out: _Out = _Out()

    def feed(self, delta: str) -> ParsedDelta:
        text, self._pending = self._pending + delta, ""
        while text:
            text = getattr(self, f"_in_{self._state}")(text)
        return self._take()

    def finish(self) -> ParsedDelta:
        """The reply ended: what was held back, and a call left open (read as it stands)."""
        rest, self._pending = self._pending, ""
        if self._state == "thinking":
            self._out.reasoning += rest
        elif self._state == "call":
            self._stream.body += rest
            self._close_call(closed=False)
        elif not (self.calls and not rest.strip()):  # whitespace after the calls is layout
            self._out.content += rest
        return self._take()

    # one state each: take what the state can from ``text``, return the rest -----------------

    def _in_start(self, text: str) -> str:
        head = text.lstrip()
        if head.startswith(OPEN):
            self._state = "thinking"
            return head[len(OPEN):]
        if OPEN.startswith(head):  # whitespace, or the start of <think>: the next delta tells
            self._pending = text
            return ""
        self._state = "answer"
        return text

    def _in_thinking(self, text: str) -> str:
        tags = (CLOSE, CALL_OPEN) if self.with_tools else (CLOSE,)
        at, tag = _first(text, tags)
        if tag is None:
            keep = max(partial_suffix(text, t) for t in tags)
            self._out.reasoning += text[:len(text) - keep]
            self._pending = text[len(text) - keep:]
            return ""
        self._out.reasoning += text[:at]
        if tag == CLOSE:
            self._state = "gap"
        else:  # a call begun inside an unclosed <think>: the thinking is over
            self._open_call()
        return text[at + len(tag):]

    def _in_gap(self, text: str) -> str:
        text = text.lstrip("\n")  # newlines between </think> and the answer are layout
        if text:
            self._state = "answer"
        return text

    def _in_answer(self, text: str) -> str:
        if not self.with_tools:
            self._out.content += text
            return ""
        at = text.find(CALL_OPEN)
        if at >= 0:
            before = text[:at].rstrip()  # the whitespace before a call is layout (text again if the call is not)
            self._out.content += before
            self._open_call(lead=text[len(before):at])
            return text[at + len(CALL_OPEN):]
        cut = len(text) - partial_suffix(text, CALL_OPEN)
        cut = len(text[:cut].rstrip())  # trailing whitespace is held too: a call may follow it
        self._out.content += text[:cut]
        self._pending = text[cut:]
        return ""

    def _in_call(self, text: str) -> str:
        call = self._stream
        start = max(0, len(call.body) - len(CALL_CLOSE) + 1)
        call.body += text
        at = call.body.find(CALL_CLOSE, start)
        if at < 0:
            self._out.calls.extend(call.advance())
            return ""
        rest, call.body = call.body[at + len(CALL_CLOSE):], call.body[:at]
        self._close_call(closed=True)
        return rest

    # calls ---------------------------------------------------------------------------------

    @property
    def _stream(self) -> _CallStream:
        """The call being read (the "call" state always has one)."""
        if self._call is None:
            raise RuntimeError("The reply parser is not reading a tool call.")
        return self._call

    def _open_call(self, lead: str = "") -> None:
        self._state = "call"
        self._call = _CallStream(self._announced, self.schemas, lead)

    def _close_call(self, *, closed: bool) -> None:
        call, self._call, self._state = self._stream, None, "answer"
        try:
            parsed = parse_call(call.body, self.schemas)
        except ToolCallError as error:
            text = call.lead + CALL_OPEN + call.body + (CALL_CLOSE if closed else "")
            log.warning("a tool call that cannot be read (%s) is sent as text: %r", error, text)
            self._out.content += text
            if call.announced:
                self.broken.append(call.index)
                self._announced += 1
            return
        parsed = ToolCall(parsed.name, parsed.arguments, call.id)
        self._out.calls.extend(call.finish(parsed))
        self.calls.append(parsed)
        self._announced += 1

    def _take(self) -> ParsedDelta:
        out, self._out = self._out, _Out()
        self.reasoning += out.reasoning
        self.content += out.content
        return ParsedDelta(out.reasoning, out.content, _merged(out.calls) if out.calls else ())


@dataclass
class _Out:
    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


class _CallStream:
    """One call being generated: what of it went out (name, arguments text) and how far its body was read."""

    def __init__(self, index: int, schemas: dict[str, dict], lead: str) -> None:
        self.index, self.schemas, self.lead = index, schemas, lead
        self.id = new_call_id()
        self.body = ""
        self.announced = False
        self.name = ""
        self._xml = False
        self.sent = ""  # the arguments text sent
        self._read = 0  # body characters read for arguments
        self._scan: ObjectScan | None = ObjectScan()
        self._parameters = 0  # XML: parameters sent

    def advance(self) -> list[CallDelta]:
        """The deltas the body read so far allows: the name once known, then arguments as they are certain."""
        deltas = []
        if not self.announced:
            head = JSON_HEAD.match(self.body) or XML_FUNCTION.match(self.body)
            if head is None:
                return []
            name = _json_name(head.group(1)) if head.re is JSON_HEAD else head.group(1).strip()
            if name is None:
                return []
            self.announced, self.name, self._read = True, name, head.end()
            self._xml = head.re is XML_FUNCTION
            deltas.append(CallDelta(self.index, self.id, name))
        more = self._xml_arguments() if self._xml else self._json_arguments()
        self.sent += more
        return deltas + ([CallDelta(self.index, arguments=more)] if more else [])

    def finish(self, call: ToolCall) -> list[CallDelta]:
        """The deltas that complete the call as parsed whole."""
        deltas = [] if self.announced else [CallDelta(self.index, self.id, call.name)]
        if self.announced and (call.name != self.name or not call.arguments.startswith(self.sent)):
            log.warning("a streamed tool call differs from its whole text: sent %r, whole %r", self.sent, call)
            return deltas
        rest = call.arguments[len(self.sent):] if self.announced else call.arguments
        return deltas + ([CallDelta(self.index, arguments=rest)] if rest else [])

    def _json_arguments(self) -> str:
        if self._scan is None or self._scan.depth < 0:
            return ""
        more = ""
        try:
            while self._read < len(self.body):
                char = self.body[self._read]
                self._read += 1
                if self._scan.start >= 0 or not char.isspace():
                    more += char
                if self._scan.push(char):
                    self._scan.depth = -1  # done: nothing more is arguments
                    break
        except ToolCallError:
            self._scan = None  # not an object: the whole call is read at its end
            return ""
        return more

    def _xml_arguments(self) -> str:
        more = ""
        properties = self.schemas.get(self.name, {}).get("properties", {})
        while (parameter := XML_PARAMETER.match(self.body, self._read)) is not None:
            key = parameter.group(1).strip()
            value = typed_value(parameter.group(2), properties.get(key, {}))
            more += ("{" if not self._parameters else ", ") + json.dumps(key, ensure_ascii=False) + ": " + \
                json.dumps(value, ensure_ascii=False)
            self._parameters += 1
            self._read = parameter.end()
        return more


def _merged(deltas: list[CallDelta]) -> tuple[CallDelta, ...]:
    """Consecutive deltas of one call as one (a delta of text can hold several steps of a call)."""
    merged: list[CallDelta] = []
    for delta in deltas:
        last = merged[-1] if merged else None
        if last is not None and last.index == delta.index and delta.id is None:
            merged[-1] = CallDelta(last.index, last.id, last.name, last.arguments + delta.arguments)
        else:
            merged.append(delta)
    return tuple(merged)


def _json_name(escaped: str) -> str | None:
    try:
        return json.loads(f'"{escaped}"') or None
    except ValueError:
        return None


def _first(text: str, tags: Sequence[str]) -> tuple[int, str | None]:
    """Where the first of ``tags`` begins in ``text``, and which; (-1, None) for none."""
    found = [(at, tag) for tag in tags if (at := text.find(tag)) >= 0]
    return min(found) if found else (-1, None)
