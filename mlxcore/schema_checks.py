"""Limits a JSON schema must keep before llguidance sees it, and the constructs it cannot enforce.

llguidance's time and memory grow with a schema's size (10,000 properties take seconds to compile and fail at
the first mask; 15,000 panic inside it), so a schema is walked first (a dict walk, no compiling) and refused
with a sentence that names the construct and where it is (a JSON pointer such as ``/properties/a/const``).
The limits: docs/structured_output.md.
"""

from __future__ import annotations

import json

MAX_SCHEMA_CHARS = 256 * 1024  # the schema as JSON text
MAX_PROPERTIES = 1_000  # properties of every object in the schema, together (1,000: about 0.1 s to compile)
MAX_ENUM_ITEMS = 1_000  # enum values in the schema, together
MAX_VALUE_CHARS = 10_000  # one const or enum value, as JSON text
MAX_DEPTH = 64  # nesting of objects and lists
MAX_VALUES = 100_000  # objects, lists and scalars in the schema: bounds this walk too (on serve's event loop)
INT_BOUND = 2**63  # llguidance reads numbers as 64-bit values
SHOWN_CHARS = 120  # of a JSON pointer or a $ref in a message (keys may be long)
SAME_VALUE = ("allOf", "anyOf", "oneOf")  # keywords whose subschemas describe the same value (not a part of it)


def check_schema(schema: dict, what: str = "JSON schema") -> None:
    """``ValueError`` naming the first limit ``schema`` passes or the construct it uses that cannot be enforced."""
    counts = {"properties": 0, "enum": 0}
    stack: list[tuple[object, str, int]] = [(schema, "", 0)]
    walked = 1
    while stack:
        node, path, depth = stack.pop()
        walked += len(node) if isinstance(node, (dict, list)) else 0  # (counted before they are stacked)
        if walked > MAX_VALUES:
            raise ValueError(f"The {what} holds more than {MAX_VALUES:,} values; a reply cannot be held to one "
                             "that large here.")
        shown = _cut(path)
        if depth > MAX_DEPTH:
            raise ValueError(f"The {what} nests deeper than {MAX_DEPTH} levels (at {shown or '/'}).")
        if isinstance(node, dict):
            _check_keywords(node, shown, counts, what)
            stack.extend((value, f"{path}/{key}", depth + 1) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, f"{path}/{i}", depth + 1) for i, value in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and not -INT_BOUND < node < INT_BOUND:
            raise ValueError(f"The {what}'s number at {shown} ({node:.3g}) is outside what a schema here can hold "
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
    describes a value that must contain itself: nothing matches it. One depth-first walk of those edges
    (a cycle among them is one of these): linear in the schema's size."""
    def edges(node: dict) -> list[tuple[str, dict]]:
        found = [(ref, _target(schema, ref)) for ref in [node.get("$ref")] if isinstance(ref, str)]
        for keyword in SAME_VALUE:
            if isinstance(node.get(keyword), list):
                found += [("", sub) for sub in node[keyword]]
        return [(ref, target) for ref, target in found if isinstance(target, dict)]

    done: set[int] = set()
    for root in _dicts(schema):
        if id(root) in done:
            continue
        path: list[tuple[int, str]] = [(id(root), "")]  # the walk's current chain: node, the edge into it
        on_path = {id(root)}
        stack = [iter(edges(root))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                node_id, _ = path.pop()
                on_path.discard(node_id)
                done.add(node_id)
                continue
            ref, target = step
            if id(target) in on_path:
                chain = [edge for node_id, edge in path[[n for n, _ in path].index(id(target)) + 1:]] + [ref]
                loop = next((edge for edge in chain if edge), "")
                raise ValueError(f"The {what}'s $ref {_cut(loop)!r} refers back to itself with no value in "
                                 "between, so no JSON value matches it: give the recursion an object or a list "
                                 "to go through.")
            if id(target) not in done:
                path.append((id(target), ref))
                on_path.add(id(target))
                stack.append(iter(edges(target)))


def _dicts(schema: dict) -> list[dict]:
    found, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else "..." + text[-SHOWN_CHARS:]


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
