"""The project's chat template: ChatML with Qwen3's thinking and tool rules, as Jinja text.

- ``<|im_start|>role\\ncontent<|im_end|>\\n`` for every message;
- with ``tools``, the system turn is Qwen3's: the system prompt (if any), then its ``# Tools`` block, one
  JSON per tool between ``<tools>`` and ``</tools>``, and how to write a ``<tool_call>``;
- assistant turns after the last user query (a user message that is not a tool result) keep their
  ``<think>`` block, earlier ones lose it (reasoning is read from ``reasoning_content`` or from a
  ``<think>...</think>`` prefix of ``content``); their ``tool_calls`` follow as Qwen3 writes them,
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
- ``tool`` messages are a user turn, one ``<tool_response>\\n...\\n</tool_response>`` per result;
- ``add_generation_prompt`` opens an assistant turn, and ``enable_thinking=false`` pre-fills an
  empty think block so the model answers directly.

Everything with tools renders as Qwen3's own template does, but for one rule kept from before: an
assistant turn after the last query keeps an empty think block too (Qwen3's drops it unless it is the
last message; mlxchat puts it back with thinking off, as the KV cache holds it: mlxcore.think_blocks).
"""

from __future__ import annotations

import json

import jinja2

TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
              "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
              '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _jinja_text(text: str) -> str:
    return json.dumps(text)  # a double-quoted Jinja string literal with the same escapes


CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- " + _jinja_text(TOOLS_HEAD) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + tool | tojson -}}{%- endfor -%}"
    "{{- " + _jinja_text(TOOLS_TAIL + "<|im_end|>\n") + " -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' and not (m.content.startswith('<tool_response>')"
    " and m.content.endswith('</tool_response>')) -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set text = m.content if m.content is string else '' -%}"
    "{%- set thought = m.reasoning_content if m.reasoning_content is string else '' -%}"
    "{%- if '</think>' in text -%}"
    "{%- set thought = text.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set text = text.split('</think>')[-1] -%}"
    "{%- endif -%}"
    "{%- set text = text.lstrip('\\n') -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_user -%}"
    "{{- '<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- text -}}"
    "{%- for call in m.tool_calls or [] -%}"
    "{%- if text or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set call = call.function if call.function is defined else call -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' -}}"
    "{{- call.arguments if call.arguments is string else call.arguments | tojson -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif not (tools and m.role == 'system' and loop.first) -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # transformers' tojson (what apply_chat_template uses): key order kept, nothing HTML-escaped
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    return env


_TEMPLATE = _environment().from_string(CHAT_TEMPLATE)


def render(messages: list[dict], tools: list[dict] | None = None, **options) -> str:
    """``messages`` as the template writes them, exactly as transformers' ``apply_chat_template`` would."""
    return _TEMPLATE.render(messages=messages, tools=tools, **options)
