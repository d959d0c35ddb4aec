"""The process that renders chat templates for `serve` (``python -m app.serve.template_worker``).

A chat template is code from a model folder (or, with ``--allow-download``, any
hub repo a client names): Jinja in transformers' sandbox, which reads and runs
nothing, but may loop for ever or build a string of gigabytes. A thread stuck in
Jinja cannot be stopped, so templates render here, in a process of their own that
`serve` kills when a render passes its deadline (``app.serve.templates``). Here
too: ``*`` and ``+`` that would make a string or list over ``MAX_CHARS`` are
refused before they run, and so is a rendered text over it.

Frames on stdin and stdout: a 4-byte big-endian length, then JSON. First a
``{"ready": true}``; then per job ``{"template", "conversation", "tools", "kwargs"}``
the answer ``{"text"}`` or ``{"error", "kind"}`` (kind "refused": the template
raised on these messages; "failed": anything else). It exits at the end of its
input, or when its parent is gone.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time

MAX_CHARS = 16 * 2**20  # a rendered prompt, or any string or list a template builds on the way


def main() -> None:
    import jinja2.exceptions
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
    from transformers.utils import chat_template_utils

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+"})  # (Jinja's hook for exactly this: call_binop)

        def call_binop(self, context, operator, left, right):
            if _size(left, operator, right) > MAX_CHARS:
                raise SecurityError(f"the template builds a value of more than {MAX_CHARS:,} characters")
            return super().call_binop(context, operator, left, right)

    chat_template_utils.ImmutableSandboxedEnvironment = BoundedEnvironment  # (this process renders nothing else)
    parent = os.getppid()
    threading.Thread(target=_orphaned, args=(parent,), daemon=True).start()
    _write({"ready": True})
    while (job := _read()) is not None:
        try:
            rendered, _ = chat_template_utils.render_jinja_template(
                conversations=[job["conversation"]], tools=job["tools"], chat_template=job["template"],
                **job["kwargs"])
            text = rendered[0]
            if len(text) > MAX_CHARS:
                raise SecurityError(f"the rendered prompt has {len(text):,} characters, over {MAX_CHARS:,}")
            _write({"text": text})
        except jinja2.exceptions.SecurityError as error:
            _write({"error": f"the sandbox refused it: {_line(error)}", "kind": "failed"})
        except jinja2.exceptions.TemplateError as error:  # raise_exception(...) in the template: about the messages
            _write({"error": _line(error), "kind": "refused"})
        except (MemoryError, RecursionError) as error:
            _write({"error": f"{type(error).__name__} while rendering", "kind": "failed"})
        except Exception as error:  # a template error of any other kind (a None called, a bad filter)
            _write({"error": f"{type(error).__name__}: {_line(error)}", "kind": "failed"})


def _size(left: object, operator: str, right: object) -> int:
    """How long ``left operator right`` would be, for strings and lists; 0 for numbers."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                return len(seq) * max(times, 0)
        return 0
    if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        return len(left) + len(right)
    return 0


def _line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def _orphaned(parent: int) -> None:
    """End this process once `serve` is gone (a killed server leaves no renderer spinning)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _read() -> dict | None:
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        return None
    return json.loads(sys.stdin.buffer.read(struct.unpack(">I", head)[0]))


def _write(message: dict) -> None:
    data = json.dumps(message).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(data)) + data)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
