"""Chat templates rendered in a worker process, with a deadline (``template_worker`` says why).

``TemplateWorker`` keeps one worker process per model and sends it one render at
a time; a render that passes ``RENDER_SECONDS`` kills the process (the next
render starts another), so nothing of `serve` ever waits on a template for
longer, and SIGTERM never finds a thread it cannot stop. ``WorkerTemplates``
stands in for the tokenizer in ``mlxcore.render_chat_text`` (its checks and its
think-block handling stay the same) and sends the Jinja part to the worker,
rendered as transformers' ``apply_chat_template`` renders it.
``probe`` renders a one-message chat when the model loads: a template that fails
that fails the load, not every request.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from mlxcore import render_chat_text

RENDER_SECONDS = 5.0  # one render (Qwen3's, of a long chat with tools: milliseconds)
START_SECONDS = 60.0  # the worker's start (it imports transformers' template code: about a second)
PROBE = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello."}]


class TemplateError(Exception):
    """The model's chat template failed (a 500: the model's fault); ``refused``: it refused these messages
    (``raise_exception`` in the template: a 400)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class TemplateWorker:
    """See the module docstring. Thread-safe: one render at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._ready = False
        self.start()

    def start(self) -> None:
        """Start the worker process now, if none runs (it gets ready while the model loads)."""
        if self._process is None or self._process.poll() is not None:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            self._process = subprocess.Popen([sys.executable, "-m", "app.serve.template_worker"],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, env=env)
            self._ready = False

    def render(self, job: dict, seconds: float = RENDER_SECONDS) -> str:
        """The text of ``job`` (see ``template_worker``); ``TemplateError`` if it fails or passes ``seconds``."""
        with self._lock:
            self.start()
            process = self._process
            assert process is not None and process.stdin is not None
            try:
                if not self._ready:
                    self._ready = bool(_read(process, START_SECONDS).get("ready"))
                data = json.dumps(job).encode()
                process.stdin.write(struct.pack(">I", len(data)) + data)
                process.stdin.flush()
                reply = _read(process, seconds)
            except TimeoutError:
                self._stop()
                raise TemplateError(f"it did not finish within {seconds:g} s") from None
            except (OSError, EOFError, ValueError) as error:
                self._stop()
                raise TemplateError(f"its renderer stopped ({error or type(error).__name__})") from None
        if "error" in reply:
            raise TemplateError(reply["error"], refused=reply.get("kind") == "refused")
        return reply["text"]

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def close(self) -> None:
        """Stop the worker (it is killed even in the middle of a render)."""
        process = self._process
        if process is not None:
            process.kill()
            process.wait()


def _read(process: subprocess.Popen, seconds: float) -> dict:
    """One frame from the worker within ``seconds``: ``TimeoutError``, ``EOFError``."""
    deadline = time.monotonic() + seconds
    out = process.stdout
    assert out is not None
    data = b""
    need = 4
    while len(data) < need:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([out], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(out.fileno(), need - len(data))
        if not chunk:
            raise EOFError("the worker exited")
        data += chunk
        if need == 4 and len(data) == 4:
            need = 4 + struct.unpack(">I", data)[0]
    return json.loads(data[4:])


class WorkerTemplates:
    """A tokenizer's chat template, rendered by a ``TemplateWorker`` (see the module docstring)."""

    def __init__(self, tokenizer, worker: TemplateWorker) -> None:
        self.tokenizer, self.worker = tokenizer, worker
        inner = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper holds the HF one
        # mlx-lm's own Python templates (not Jinja, not from the model folder) render in this process
        jinja = getattr(tokenizer, "_chat_template", None) is None and hasattr(inner, "get_chat_template")
        self._hf = inner if jinja else None
        self.has_chat_template = getattr(tokenizer, "has_chat_template", False)

    def apply_chat_template(self, conversation: Sequence[dict], *, add_generation_prompt: bool,
                            enable_thinking: bool, tokenize: bool = False, tools: list | None = None) -> str:
        """As the tokenizer's, as ``mlxcore.render_chat_text`` calls it (text, not ids)."""
        assert not tokenize
        if self._hf is None:
            return self.tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                                      enable_thinking=enable_thinking, tokenize=False, tools=tools)
        thinking = getattr(self.tokenizer, "_thinking_kwarg", "enable_thinking")  # (mlx-lm's rename)
        job = {"template": self._hf.get_chat_template(None, tools), "tools": tools,
               # transformers drops None values from messages before rendering
               "conversation": [{k: v for k, v in m.items() if v is not None} for m in conversation],
               "kwargs": {**self._hf.special_tokens_map, thinking: enable_thinking,
                          "add_generation_prompt": add_generation_prompt}}
        return self.worker.render(job)

    def render(self, messages: Sequence[dict], enable_thinking: bool, add_generation_prompt: bool = True,
               tools: Sequence[dict] | None = None) -> str:
        """``mlxcore.render_chat_text`` with this template (blocking: call it off the event loop)."""
        return render_chat_text(self, messages, enable_thinking=enable_thinking,  # type: ignore[arg-type]
                                add_generation_prompt=add_generation_prompt, tools=tools)

    def probe(self) -> None:
        """Render a one-message chat: ``TemplateError`` if the template fails it."""
        if self.has_chat_template:
            self.render(PROBE, enable_thinking=False)
