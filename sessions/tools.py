"""Tools a ``ChatSession`` offers the model: Python functions (schema from their hints and docstring) or schemas.

``function_tool(fn)`` writes OpenAI's function-tool schema for ``fn``: its
name, its docstring's first paragraph as the description, one property per
parameter typed from its hint (``str``, ``int``, ``float``, ``bool``, ``list[...]``,
``dict``, ``Literal[...]``, ``X | None``), described from a Google-style
``Args:`` section, required unless it has a default. ``Toolbox.run`` calls the
function a call names; whatever goes wrong (no such tool, arguments that do
not fit, an exception) becomes the result the model reads, so the chat goes on.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Literal, Union

from mlxcore import ToolCall

ToolSpec = Callable[..., object] | dict
_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def function_tool(fn: Callable[..., object]) -> dict:
    """OpenAI's ``{"type": "function", "function": {...}}`` schema for ``fn`` (see the module docstring)."""
    hints = typing.get_type_hints(fn)
    described = _argument_docs(inspect.getdoc(fn) or "")
    properties, required = {}, []
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ValueError(f"tool {fn.__name__!r}: *args and **kwargs cannot be described to the model")
        schema = type_schema(hints.get(name, str), f"{fn.__name__}({name})")
        if name in described:
            schema["description"] = described[name]
        properties[name] = schema
        if parameter.default is parameter.empty:
            required.append(name)
    summary = (inspect.getdoc(fn) or "").split("\n\n")[0].strip()
    function = {"name": fn.__name__, "description": summary,
                "parameters": {"type": "object", "properties": properties, "required": required}}
    return {"type": "function", "function": function}


def type_schema(hint: object, where: str) -> dict:
    """The JSON schema of a type hint."""
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return {"type": _SIMPLE[type(args[0])], "enum": list(args)}
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        schema = type_schema(kept[0], where) if len(kept) == 1 else {"anyOf": [type_schema(a, where) for a in kept]}
        return schema | ({"nullable": True} if len(kept) < len(args) else {})
    if origin in (list, Sequence, tuple):
        return {"type": "array"} | ({"items": type_schema(args[0], where)} if args and args[0] is not Ellipsis else {})
    if origin is dict:
        return {"type": "object"}
    raise ValueError(f"tool parameter {where}: the type {hint!r} cannot be described to the model; use str, int, "
                     "float, bool, list, dict, Literal or Optional")


def _argument_docs(doc: str) -> dict[str, str]:
    """``name: description`` lines of a Google-style ``Args:`` section."""
    found = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    if not found:
        return {}
    described: dict[str, str] = {}
    for line in found.group(1).splitlines():
        item = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if item:
            described[item.group(1)] = item.group(2).strip()
        elif described and line.strip():  # a description continued on the next line
            last = next(reversed(described))
            described[last] += " " + line.strip()
    return described


class Toolbox:
    """The tools of one session: their schemas (offered to the model) and the functions that run them."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self.schemas: list[dict] = []
        self.functions: dict[str, Callable[..., object]] = {}
        for tool in tools:
            schema = tool if isinstance(tool, dict) else function_tool(tool)
            if "function" not in schema or "name" not in schema["function"]:
                raise ValueError(f'a tool schema is {{"type": "function", "function": {{"name": ...}}}}, not {tool!r}')
            self.schemas.append(schema)
            if callable(tool):
                self.functions[schema["function"]["name"]] = tool

    def run(self, call: ToolCall) -> str:
        """The result of ``call`` as text for the model: the function's return (JSON unless text), or the error."""
        function = self.functions.get(call.name)
        if function is None:
            known = ", ".join(self.functions) or "none"
            return f"Error: there is no tool {call.name!r} to run (tools: {known})."
        try:
            result = function(**call.parsed_arguments())
        except Exception as error:  # the model reads it and may try again; the chat goes on
            return f"Error: {call.name} failed: {type(error).__name__}: {error}"
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
