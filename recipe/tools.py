"""The tools the embedded models learn to call (``app.mcp.demo_tools``, which the window offers too), and a
call's text."""

from __future__ import annotations

import json

from app.mcp.demo_tools import (CALCULATOR, CONVERT_UNITS, FACTORS, GET_TIME, TEMPERATURES, TOOLS, Clock, calculate,
                                convert, number_text, run)

__all__ = ["CALCULATOR", "CONVERT_UNITS", "FACTORS", "GET_TIME", "TEMPERATURES", "TOOLS", "calculate", "convert",
           "number_text", "Clock", "run", "call_message", "call_text"]


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
