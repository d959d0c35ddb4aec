"""The three tools the embedded pair learned to call (``recipe/``): their schemas and what they do.

The window offers them through ``demo_server`` (``mlxchat --demo-tools``); the recipe builds its tool
conversations from the same functions, so a call the model makes in the window gets the reply it trained on.
"""

from __future__ import annotations

import ast
import json
import operator
import time
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


def number_text(x: float) -> str:
    """A result as the tools write it: at most two decimals, no trailing zeros (41.84, 100, -3.5)."""
    text = f"{round(x, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def calculate(expression: str) -> int:
    """The value of an expression of integers with +, - and * (nothing else is evaluated)."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return int(_OPS[type(node.op)](value(node.left), value(node.right)))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise ValueError(f"the calculator reads integers with +, - and *, not {expression!r}")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError(f"the calculator reads integers with +, - and *, not {expression!r}") from None
    return value(tree.body)


def convert(value: float, source: str, target: str) -> float:
    if (source, target) in TEMPERATURES:
        return float(TEMPERATURES[source, target](value))
    if (source, target) in FACTORS:
        return value * FACTORS[source, target]
    raise ValueError(f"no conversion from {source} to {target}")


@dataclass(frozen=True)
class Clock:
    """What get_time reports: this machine's local time, or one the recipe draws per conversation."""

    date: str      # 2026-11-26
    time: str      # 14:05
    weekday: str   # Thursday

    @classmethod
    def now(cls) -> Clock:
        local = time.localtime()
        return cls(time.strftime("%Y-%m-%d", local), time.strftime("%H:%M", local), time.strftime("%A", local))


def run(name: str, arguments: dict, clock: Clock | None = None) -> str:
    """The tool's reply (JSON text, the content of the ``tool`` message) to one call; get_time reads
    ``clock`` (default: this machine's local time). A bad call raises ValueError, saying why."""
    if name == "calculator":
        return json.dumps({"result": calculate(str(arguments.get("expression", "")))})
    if name == "get_time":
        clock = clock or Clock.now()
        return json.dumps({"date": clock.date, "time": clock.time, "weekday": clock.weekday})
    if name == "convert_units":
        try:
            value, source, target = float(arguments["value"]), arguments["from"], arguments["to"]
        except (KeyError, TypeError, ValueError):
            raise ValueError("convert_units takes a number \"value\" and the units \"from\" and \"to\"") from None
        return f'{{"value": {number_text(convert(value, source, target))}, "unit": {json.dumps(target)}}}'
    raise ValueError(f"no tool named {name!r}")
