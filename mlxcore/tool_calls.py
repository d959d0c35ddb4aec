"""Tool calls as Qwen models write them, read from the text between ``<tool_call>`` and ``</tool_call>``.

Two formats, told apart by the body's first character:

- Qwen3 (JSON): ``{"name": "get_weather", "arguments": {"city": "Paris"}}``.
- Qwen3-Coder and later Qwen releases (XML)::

      <function=get_weather>
      <parameter=city>
      Paris
      </parameter>
      </function>

  (values bare text, typed from the tool's schema: ``typed_value``).

A ``ToolCall``'s ``arguments`` is JSON text, as OpenAI's API carries it: for the JSON format, exactly as the
model wrote it (what the stream sent, and what the chat template writes back next turn, so the KV cache still
matches).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# Qwen3's header: the name first, then the arguments object (the order its template and training use)
JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
XML_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
XML_END = re.compile(r"\s*</function>\s*$")


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as JSON text of an object."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def parsed_arguments(self) -> dict:
        arguments = json.loads(self.arguments)
        if not isinstance(arguments, dict):  # (parse_call made sure of it)
            raise ToolCallError(f"The arguments of {self.name} are not a JSON object.")
        return arguments

    def as_dict(self) -> dict:
        """OpenAI's shape (``message.tool_calls[i]``), which chat templates read too."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ToolCallError(ValueError):
    """The text of a call could not be read as one."""


def tool_names(tools: Iterable[object]) -> dict[str, dict]:
    """OpenAI function tools (``{"type": "function", "function": {...}}``) by name: their parameter schemas
    (``{}`` for none); ``ValueError`` for a tool that is not one."""
    named = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError("Each tool must be an OpenAI function tool with a name.")
        named[function["name"]] = function.get("parameters") or {}
    return named


def parse_call(body: str, schemas: dict[str, dict] | None = None) -> ToolCall:
    """The call written in ``body`` (the text inside ``<tool_call>``); ``ToolCallError`` if it is none."""
    if body.lstrip().startswith("<function="):
        return _parse_xml(body, schemas or {})
    try:
        value = json.loads(body)
    except ValueError as error:
        raise ToolCallError(f"not JSON ({error})") from None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ToolCallError('not an object with a "name"')
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ToolCallError("its arguments are a string that is not JSON") from None
    if not isinstance(arguments, dict):
        raise ToolCallError("its arguments are not an object")
    return ToolCall(value["name"], json_arguments_text(body) or json.dumps(arguments, ensure_ascii=False))


def json_arguments_text(body: str) -> str | None:
    """The arguments object of a JSON call as written, when the name comes first (Qwen3's order)."""
    head = JSON_HEAD.match(body)
    if head is None:
        return None
    scan = ObjectScan()
    try:
        for at in range(head.end(), len(body)):
            if scan.push(body[at]):
                return body[head.end() + scan.start:at + 1]
    except ToolCallError:  # written as a string
        return None
    return None


class ObjectScan:
    """Finds where a JSON object ends, one character at a time (strings and escapes followed, not validated)."""

    def __init__(self) -> None:
        self.depth = 0
        self.start = -1  # characters before the opening brace (whitespace)
        self._seen = 0
        self._in_string = self._escaped = False

    def push(self, char: str) -> bool:
        """Whether ``char`` closes the object; raises ``ToolCallError`` when the value is not an object."""
        self._seen += 1
        if self.start < 0:
            if char.isspace():
                return False
            if char != "{":
                raise ToolCallError("its arguments are not an object")
            self.start = self._seen - 1
        if self._in_string:
            self._escaped, self._in_string = (False, True) if self._escaped else (char == "\\", char != '"')
            return False
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
        return self.depth == 0


def _parse_xml(body: str, schemas: dict[str, dict]) -> ToolCall:
    head = XML_FUNCTION.match(body)
    if head is None:
        raise ToolCallError("no <function=NAME>")
    name, at, arguments = head.group(1).strip(), head.end(), {}
    properties = schemas.get(name, {}).get("properties", {})
    while (parameter := XML_PARAMETER.match(body, at)) is not None:
        key = parameter.group(1).strip()
        arguments[key] = typed_value(parameter.group(2), properties.get(key, {}))
        at = parameter.end()
    if XML_END.match(body, at) is None:
        raise ToolCallError("text after its parameters, or no </function>")
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def typed_value(text: str, schema: dict) -> object:
    """An XML parameter's text as its schema's type says; text when the schema says string or it cannot be read."""
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if kinds == ["string"] or (not kinds and "enum" in schema and all(isinstance(v, str) for v in schema["enum"])):
        return text
    if text.strip().lower() == "null" and ("null" in kinds or not kinds):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if kinds and not any(_is(value, kind) for kind in kinds):
        return text
    return value


def _is(value: object, kind: str) -> bool:
    checks = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "boolean": lambda v: isinstance(v, bool), "object": lambda v: isinstance(v, dict),
              "array": lambda v: isinstance(v, list), "null": lambda v: v is None, "string": lambda v: False}
    return checks.get(kind, lambda v: True)(value)
