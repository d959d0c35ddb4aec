"""The project's chat template: ChatML with Qwen3's thinking rules, as Jinja text.

- ``<|im_start|>role\\ncontent<|im_end|>\\n`` for every message;
- assistant turns after the last user message keep their ``<think>`` block, earlier ones lose it
  (reasoning is read from ``reasoning_content`` or from a ``<think>...</think>`` prefix of ``content``);
- ``add_generation_prompt`` opens an assistant turn, and ``enable_thinking=false`` pre-fills an
  empty think block so the model answers directly.
"""

CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set text = m.content if m.content is string else '' -%}"
    "{%- set thought = m.reasoning_content if m.reasoning_content is string else '' -%}"
    "{%- if '</think>' in text -%}"
    "{%- set thought = text.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set text = text.split('</think>')[-1] -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_user -%}"
    "{{- '<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- text.lstrip('\\n') + '<|im_end|>\\n' -}}"
    "{%- else -%}"
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
