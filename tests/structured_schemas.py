"""Twenty JSON schemas for the structured-output tests: enums, nested objects, bounded arrays, number ranges,
patterns, ``anyOf``, ``$ref``, formats.

Every string, array, object and number is bounded (a length, a pattern, an enum, no extra properties, a
``multipleOf`` for a fractional number): a random-weight model writes noise, and inside an unbounded string
it would almost never pick the closing quote among 150,000 tokens (nor stop adding a number's digits), so
the reply would end at its token cap, not in the schema.
"""

from __future__ import annotations


def _object(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required,
            "additionalProperties": False}


SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 9}
POINT = _object({"x": SMALL_INT, "y": SMALL_INT})

SCHEMAS: dict[str, dict] = {
    "enum": {"type": "string", "enum": ["red", "green", "blue"]},
    "enum_and_range": _object({"color": {"enum": ["red", "green"]},
                               "size": {"type": "integer", "minimum": 1, "maximum": 10}}),
    "nested": _object({"person": _object({"name": {"type": "string", "maxLength": 12},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 120}})}),
    "array_bounds": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2, "maxItems": 4},
    "number_range": _object({"t": {"type": "number", "minimum": -5, "maximum": 5, "multipleOf": 0.5}}),
    "pattern": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "any_of": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"enum": ["none"]}]},
    "bool_null": _object({"ok": {"type": "boolean"}, "note": {"type": "null"}}),
    "array_of_objects": {"type": "array", "minItems": 1, "maxItems": 3,
                         "items": _object({"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                           "tag": {"type": "string", "pattern": "^[a-z]{2,5}$"}})},
    "const": _object({"version": {"const": 2}, "kind": {"const": "point"}}),
    "exclusive_range": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1, "multipleOf": 0.01},
    "string_length": {"type": "string", "minLength": 3, "maxLength": 6},
    "refs": {"$defs": {"pt": POINT}, **_object({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    "any_of_objects": {"anyOf": [_object({"kind": {"const": "circle"}, "r": SMALL_INT}),
                                 _object({"kind": {"const": "square"}, "side": SMALL_INT})]},
    "optional": _object({"title": {"type": "string", "maxLength": 10},
                         "year": {"type": "integer", "minimum": 1900, "maximum": 2030}}, required=["title"]),
    "date_format": _object({"when": {"type": "string", "format": "date"}}),
    "mixed_enum": {"enum": [1, "two", None, True]},
    "fixed_array": {"type": "array", "items": {"type": "integer", "minimum": -10, "maximum": 10},
                    "minItems": 3, "maxItems": 3},
    "nested_arrays": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2,
                                                                "items": {"type": "boolean"}}},
    "deep": _object({"a": _object({"b": _object({"c": {"enum": ["x", "y"]}})})}),
}
