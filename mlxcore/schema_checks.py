"""Limits a JSON schema must keep before llguidance sees it, and the constructs it cannot enforce.

llguidance's time and memory grow with a schema's size: 10,000 properties take
seconds to compile and fail at the first mask, 15,000 panic inside it. So a
schema is walked first (cheap: a dict walk, no compiling) and refused with a
sentence that names the construct and where it is (a JSON pointer such as
``/properties/a/const``): too many properties or enum items, a ``const`` or
enum value too long, a number JSON libraries cannot hold (64 bits), a ``$ref``
that refers back to itself with no value in between (no JSON value matches it).
"""

from __future__ import annotations

import json

MAX_SCHEMA_CHARS = 256 * 1024  # the schema as JSON text
MAX_PROPERTIES = 1_000  # properties of every object in the schema, together (1,000: about 0.1 s to compile)
MAX_ENUM_ITEMS = 1_000  # enum values in the schema, together
MAX_VALUE_CHARS = 10_000  # one const or enum value, as JSON text
MAX_DEPTH = 64  # nesting of objects and lists
INT_BOUND = 2**63  # llguidance reads numbers as 64-bit values
SAME_VALUE = ("allOf", "anyOf", "oneOf")  # keywords whose subschemas describe the same value (not a part of it)


def check_schema(schema: dict, what: str = "JSON schema") -> None:
    """``ValueError`` naming the first limit ``schema`` passes or the construct it uses that cannot be enforced."""
    counts = {"properties": 0, "enum": 0}
    stack: list[tuple[object, str, int]] = [(schema, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"The {what} nests deeper than {MAX_DEPTH} levels (at {path or '/'}).")
        if isinstance(node, dict):
            _check_keywords(node, path, counts, what)
            stack.extend((value, f"{path}/{key}", depth + 1) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, f"{path}/{i}", depth + 1) for i, value in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and not -INT_BOUND < node < INT_BOUND:
            raise ValueError(f"The {what}'s number at {path} ({node:.3g}) is outside what a schema here can hold "
                             "(a 64-bit integer): use a smaller bound, or leave it out.")
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_CHARS:
        raise ValueError(f"The {what} is {size:,} characters of JSON; at most {MAX_SCHEMA_CHARS:,} here.")
    _check_refs(schema, what)


def _check_keywords(node: dict, path: str, counts: dict[str, int], what: str) -> None:
    properties = node.get("properties")
    if isinstance(properties, dict):
        counts["properties"] += len(properties)
        if counts["properties"] > MAX_PROPERTIES:
            raise ValueError(f"The {what} has more than {MAX_PROPERTIES:,} properties (at {path or '/'}), more "
                             "than a reply can be held to here: split it, or leave the rarer ones out.")
    values = node.get("enum")
    if isinstance(values, list):
        counts["enum"] += len(values)
        if counts["enum"] > MAX_ENUM_ITEMS:
            raise ValueError(f"The {what} has more than {MAX_ENUM_ITEMS:,} enum values (at {path}/enum).")
    for keyword, value in (("const", node.get("const")), *(("enum", v) for v in values or ())):
        chars = len(value) if isinstance(value, str) else len(json.dumps(value)) if value is not None else 0
        if chars > MAX_VALUE_CHARS:
            raise ValueError(f"The {what}'s {keyword} at {path}/{keyword} has {chars:,} characters; at most "
                             f"{MAX_VALUE_CHARS:,} here.")


def _check_refs(schema: dict, what: str) -> None:
    """A ``$ref`` reached again through ``$ref``s and same-value keywords only (no property or item between)
    describes a value that must contain itself: nothing matches it."""
    def same_value(node: object) -> list[tuple[str, object]]:
        if not isinstance(node, dict):
            return []
        found = [(ref, _target(schema, ref)) for ref in [node.get("$ref")] if isinstance(ref, str)]
        for keyword in SAME_VALUE:
            found += [("", sub) for sub in node.get(keyword) or () if isinstance(node.get(keyword), list)]
        return found

    for start_ref in sorted(_refs(schema)):
        seen: set[int] = set()
        todo = [_target(schema, start_ref)]
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            for ref, target in same_value(node):
                if ref == start_ref:
                    raise ValueError(f"The {what}'s $ref {start_ref!r} refers back to itself with no value in "
                                     "between, so no JSON value matches it: give the recursion an object or a "
                                     "list to go through.")
                todo.append(target)


def _refs(schema: dict) -> set[str]:
    found, stack = set(), [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                found.add(node["$ref"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _target(schema: dict, ref: str) -> object:
    """The local subschema ``ref`` points to (``#/$defs/a``), or None (a remote or broken reference)."""
    if not ref.startswith("#"):
        return None
    node: object = schema
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
