"""A model whose replies are scripted, for tests of tool calls (the embedded pair does not call tools yet).

The model still runs every forward pass; only the token each step picks is
replaced: the next token of the scripted reply, then end of text. Which reply
a request gets is chosen from its prompt: the first rule whose needle occurs in
the prompt's last turns (after its last ``<|im_start|>user``) gives it, so a
tool call can be scripted for a question and an answer for the tool's result.
Used by ``scripted_model`` in a test's process, or by ``serve_scripted.py`` in
a server's (rules from the ``MLXCHAT_TEST_SCRIPT`` file, as JSON).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from unittest import mock

import mlx.core as mx

from mlxcore.batching import live as live_module
from mlxcore.sampling import TokenPicker

USER = "<|im_start|>user"


@contextmanager
def scripted_model(tokenizer, eos_id: int, rules: Sequence[tuple[str, str]]) -> Iterator[list[str]]:
    """Within the block, replies follow ``rules`` ((needle, reply text)); yields the prompts' last turns seen."""
    seen: list[str] = []

    class ScriptedPicker(TokenPicker):
        def __init__(self, params, history: list[int]) -> None:
            super().__init__(params, history)
            tail = tokenizer.decode(list(history)).rsplit(USER, 1)[-1]
            seen.append(tail)
            reply = next((text for needle, text in rules if needle in tail), None)
            self.script = None if reply is None else list(tokenizer.encode(reply, add_special_tokens=False))
            self.step = 0

        def __call__(self, logits: mx.array) -> tuple[mx.array, mx.array]:
            token, logprob = super().__call__(logits)
            if self.script is not None:
                forced = self.script[self.step] if self.step < len(self.script) else eos_id
                token = mx.array([forced], dtype=token.dtype)
            self.step += 1
            return token, logprob

    with mock.patch.object(live_module, "TokenPicker", ScriptedPicker):
        yield seen
