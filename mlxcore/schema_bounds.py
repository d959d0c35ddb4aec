"""A JSON schema made finite where it leaves a reply unbounded, before llguidance compiles it.

Clients' schemas (pydantic's, instructor's, LangChain's, pydantic-ai's) leave out
``additionalProperties`` and bounds; under them a small or random model writes
extra keys, digits and string characters until ``max_tokens``. So, where the
schema says nothing (what it says is kept), objects with ``properties`` are closed and integers,
numbers and strings bounded (``INT_LIMIT``, ``NUMBER_LIMIT`` and ``DECIMALS``, ``STRING_CHARS``); the
table of bounds and why each: docs/structured_output.md, "What the schema leaves open is closed".
"""

from __future__ import annotations

import copy

INT_LIMIT = 10**18  # |an integer| at most: 19 digits, inside int64 (2**63 is ~9.2e18)
NUMBER_LIMIT = 10**15  # |a number| at most: 16 integer digits, whose integer part a double holds exactly
DECIMALS = 9  # a number's decimals at most (``multipleOf`` 1e-9)
STRING_CHARS = 4_096  # a string's characters at most: a long paragraph
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_VALUES = ("items", "additionalProperties", "additionalItems", "contains", "propertyNames", "not", "if",
                 "then", "else", "unevaluatedItems", "unevaluatedProperties")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def bounded(schema: dict) -> dict:
    """A copy of ``schema`` with the bounds above where it gives none (see the module docstring)."""
    schema = copy.deepcopy(schema)
    _bound(schema, in_all_of=False)
    return schema


def _bound(node: object, in_all_of: bool) -> None:
    if not isinstance(node, dict):
        return
    kinds = node.get("type")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds}
    if isinstance(node.get("properties"), dict) and not in_all_of:
        node.setdefault("additionalProperties", False)
    if "number" in kinds:
        _range(node, NUMBER_LIMIT)
        node.setdefault("multipleOf", 10.0**-DECIMALS)
    elif "integer" in kinds:
        _range(node, INT_LIMIT)
    if "string" in kinds and not {"enum", "const"} & node.keys():
        node.setdefault("maxLength", max(STRING_CHARS, _int(node.get("minLength"))))
    for key in SCHEMA_MAPS:
        subs = node.get(key)
        for sub in subs.values() if isinstance(subs, dict) else ():
            _bound(sub, in_all_of=False)
    for key in SCHEMA_VALUES:
        _bound(node.get(key), in_all_of=False)
    for key in SCHEMA_LISTS:
        subs = node.get(key)
        for sub in subs if isinstance(subs, list) else ():
            _bound(sub, in_all_of=key == "allOf")


def _range(node: dict, limit: int) -> None:
    """``-limit .. limit`` on the sides the schema leaves open (not past a bound it gives on the other side)."""
    low, high = _given(node, "minimum"), _given(node, "maximum")
    if low is None and (high is None or high > -limit):
        node["minimum"] = -limit
    if high is None and (low is None or low < limit):
        node["maximum"] = limit


def _given(node: dict, side: str) -> float | None:
    for key in (side, "exclusive" + side[0].upper() + side[1:]):
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
