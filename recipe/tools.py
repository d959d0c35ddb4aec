"""The tools the embedded models learn to call: their schemas, what they return, and a call's text."""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """An OpenAI function tool, the shape clients send and Qwen3's template lists."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


# Compact schemas: every token of the tools block is read by each call's prompt, and long prompts
# crowded the rest of the training out (docs: recipe/README.md, "Tools").
CALCULATOR = _function("calculator", "Compute integers with +, - and *.", {"expression": {"type": "string"}},
                       ["expression"])
GET_TIME = _function("get_time", "The local date, time and weekday.", {}, [])
CONVERT_UNITS = _function("convert_units", "Convert a value between units.",
                          {"value": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
                          ["value", "from", "to"])
TOOLS = {t["function"]["name"]: t for t in (CALCULATOR, GET_TIME, CONVERT_UNITS)}

# unit -> (other unit, factor): value in other unit = value * factor; none of these is in the models' own table
FACTORS = {
    ("miles", "kilometers"): 1.609344, ("kilometers", "miles"): 1 / 1.609344,
    ("pounds", "kilograms"): 0.45359237, ("kilograms", "pounds"): 1 / 0.45359237,
    ("inches", "centimeters"): 2.54, ("feet", "meters"): 0.3048, ("meters", "feet"): 1 / 0.3048,
    ("gallons", "liters"): 3.785411784, ("ounces", "grams"): 28.349523125,
}
TEMPERATURES = {("fahrenheit", "celsius"): lambda f: (f - 32) * 5 / 9,
                ("celsius", "fahrenheit"): lambda c: c * 9 / 5 + 32}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


@dataclass(frozen=True)
class Clock:
    """What get_time reports: the build draws one per conversation, the evaluation replays it."""

    date: str      # 2026-11-26
    time: str      # 14:05
    weekday: str   # Thursday


def number_text(x: float) -> str:
    """A result as the tools write it: at most two decimals, no trailing zeros (41.84, 100, -3.5)."""
    text = f"{round(x, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def calculate(expression: str) -> int:
    """The value of an expression of integers with +, - and * (nothing else is evaluated)."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise ValueError(f"the calculator reads integers with +, - and *, not {expression!r}")
    return value(ast.parse(expression, mode="eval").body)


def convert(value: float, source: str, target: str) -> float:
    if (source, target) in TEMPERATURES:
        return TEMPERATURES[source, target](value)
    if (source, target) in FACTORS:
        return value * FACTORS[source, target]
    raise ValueError(f"no conversion from {source} to {target}")


def run(name: str, arguments: dict, clock: Clock) -> str:
    """The tool's reply (JSON text, the content of the ``tool`` message) to one call."""
    if name == "calculator":
        return json.dumps({"result": calculate(arguments["expression"])})
    if name == "get_time":
        return json.dumps({"date": clock.date, "time": clock.time, "weekday": clock.weekday})
    if name == "convert_units":
        result = number_text(convert(arguments["value"], arguments["from"], arguments["to"]))
        return f'{{"value": {result}, "unit": {json.dumps(arguments["to"])}}}'
    raise ValueError(f"no tool named {name!r}")


def call_message(thought: str, calls: list[tuple[str, dict]]) -> dict:
    """An assistant turn that calls tools, (name, arguments) each, as clients send it back (reasoning in a
    think block)."""
    return {"role": "assistant", "content": f"<think>\n{thought}\n</think>\n\n",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}
                           for name, arguments in calls]}


def call_text(calls: list[tuple[str, dict]]) -> str:
    """The calls as the model writes them (and the template renders them): one block each, a line apart."""
    return "\n".join(f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n'
                      "</tool_call>" for name, arguments in calls)
