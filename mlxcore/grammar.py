"""What a reply must match, as llguidance grammars: a JSON schema, any JSON object, or a Qwen3 tool call.

No MLX here: ``serve`` builds a ``Grammar`` from the request (a bad schema is a
400 there) and the engine compiles it against the model's tokenizer
(``batching/constraints.py``). JSON is written compactly, with the separators
Python's ``json.dumps`` uses (``", "``, ``": "``): no free whitespace, which a
small or random model would otherwise repeat until its token cap.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llguidance import LLMatcher

from mlxcore.schema_bounds import bounded
from mlxcore.schema_checks import check_schema
from mlxcore.tool_calls import tool_names

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # (a typed dict of the stubs only)

JSON_STYLE: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict = {"type": "object"}
ERROR_CHARS = 300  # of llguidance's message in ours: its first line, no grammar text or parser state
# llguidance's messages for constructs clients write, in their terms (its own names options they cannot set)
PLAIN_ERRORS = {"oneOf constraints are not supported": "oneOf whose branches may match the same value cannot be "
                "enforced (a reply could match two): use anyOf, or make the branches exclusive"}


@dataclass(frozen=True)
class Grammar:
    """A compiled-to-text llguidance grammar and what it came from (for messages)."""

    text: str  # llguidance's grammar (JSON text), as ``LLMatcher`` takes it
    source: str  # "JSON schema", "JSON object", "tool call": what an error message names
    # The same with the call tags as text, for a tokenizer that has no token for them (the embedded model's)
    text_untagged: str | None = None
    # An ``LLMatcher`` compiled already for the model's tokenizer (``serve`` compiles it off its event loop);
    # each reply takes a copy. None: the engine compiles it.
    compiled: LLMatcher | None = field(default=None, compare=False, repr=False)

    def for_tokenizer(self, has_tags: bool) -> str:
        """The grammar text for a tokenizer with (or without) ``<tool_call>`` as one token."""
        return self.text if has_tags or self.text_untagged is None else self.text_untagged


def json_schema(schema: dict | str | type) -> Grammar:
    """A grammar for JSON text that validates against ``schema`` (a dict, JSON text, or a pydantic model class),
    made finite where it says nothing (``schema_bounds``: no extra keys, bounded numbers and strings).

    Raises ``ValueError`` naming what is over the limits (``schema_checks``) or what llguidance cannot
    compile (an unknown format, a look-around in a pattern, an unsupported keyword such as ``not``)."""
    schema = schema_dict(schema)
    check_schema(schema)
    try:
        text = LLMatcher.grammar_from_json_schema(bounded(schema), overrides=JSON_STYLE)
    except ValueError as error:
        raise ValueError(f"This JSON schema cannot be used for constrained decoding: {short_error(str(error))}") \
            from None
    return _checked(Grammar(text, "JSON schema"))


def json_object() -> Grammar:
    """A JSON object of any shape (OpenAI's ``response_format: json_object``)."""
    return json_schema(ANY_OBJECT)


def tool_call_grammar(tools: list[dict], name: str | None = None, parallel: bool = True) -> Grammar:
    """Qwen3's tool call: ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``, ARGS matching
    that tool's parameters. ``name``: only that tool (one call); else any of ``tools``, one call or, with
    ``parallel``, several in a row. ``tools``: OpenAI function tools (``{"type": "function", "function": ...}``)."""
    functions = {tool: parameters or ANY_OBJECT for tool, parameters in tool_names(tools).items()}
    for tool, parameters in functions.items():
        if not isinstance(parameters, dict):
            raise ValueError(f"The parameters of the tool {tool!r} must be a JSON schema (an object).")
        check_schema(parameters, f"parameters schema of the tool {tool!r}")
        functions[tool] = bounded(parameters)
    if name is not None:
        if name not in functions:
            raise ValueError(f"tool_choice names {name!r}, which is not one of the tools: {', '.join(functions)}.")
        functions = {name: functions[name]}
    rules = [f"call{i}: %json {json.dumps(_call_schema(n, params))}" for i, (n, params) in enumerate(functions.items())]
    body = " | ".join(f"call{i}" for i in range(len(functions)))
    start = "start: block (\"\\n\" block)*" if parallel and name is None else "start: block"

    def compiled(block: str) -> str:
        return LLMatcher.grammar_from_lark("\n".join([start, f"block: {block}", f"body: {body}", *rules]))
    # Qwen3's tags are added tokens, which llguidance matches by name only; without them, they are text
    tagged = compiled(r'<tool_call> "\n" body "\n" </tool_call>')
    untagged = _checked(Grammar(compiled(r'"<tool_call>\n" body "\n</tool_call>"'), "tool call")).text
    return _checked(Grammar(tagged, "tool call", untagged))


def schema_dict(schema: dict | str | type) -> dict:
    """``schema`` as a dict: JSON text parsed, a pydantic model's ``model_json_schema()``."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"The JSON schema is not JSON: {error}.") from None
    elif isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if not isinstance(schema, dict):
        raise ValueError(f"A JSON schema must be an object (a dict), not {type(schema).__name__}.")
    return schema


def _call_schema(name: str, parameters: dict) -> dict:
    """The call's JSON: its name fixed, its arguments the tool's parameters (keys in Qwen3's order). The
    parameters' definitions (a pydantic model's nested ones, ``$defs``) go to the call's root, where their
    ``#/$defs/...`` references point."""
    arguments = {key: value for key, value in parameters.items() if key not in ("$defs", "definitions")}
    definitions = {key: parameters[key] for key in ("$defs", "definitions") if key in parameters}
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_STYLE, **definitions}


def short_error(error: str) -> str:
    """llguidance's ``error`` for a client: without the grammar, parser state or backtrace it may append, on one
    line, cut; its own option names put in the client's terms."""
    for said, plain in PLAIN_ERRORS.items():
        if said in error:
            return plain
    line = " ".join(re.split(r"<grammar>|<backtrace>|<non-verbose|<state>", error)[0].split()) or "unknown error"
    return line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS] + "..."


def _checked(grammar: Grammar) -> Grammar:
    error = LLMatcher.validate_grammar(grammar.text)
    if error:
        raise ValueError(f"This {grammar.source} cannot be used for constrained decoding: {short_error(error)}")
    return grammar
