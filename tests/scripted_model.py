"""A model whose replies are scripted, for tests of tool calls the embedded pair would not make by itself.

The model still runs every forward pass; only the token each step may pick is
fixed, by a per-reply mask (``PositionMask``, which the decode loop applies as
it applies a grammar's, in plain steps, batches and speculative rounds alike):
the next token of the scripted reply, then end of text. Which reply a request
gets is chosen from its prompt: the first rule whose needle occurs in the
prompt's last turns (after its last ``<|im_start|>user``) gives it, so a tool
call can be scripted for a question and an answer for the tool's result. A
request no rule matches decodes as usual. Used by ``scripted_model`` in a
test's process, or by ``serve_scripted.py`` in a server's (rules from the
``MLXCHAT_TEST_SCRIPT`` file, as JSON).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from unittest import mock

import numpy as np

from mlxcore.batching.constraints import PositionMask
from mlxcore.batching.runner import BatchRunner

USER = "<|im_start|>user"


class ScriptedReply(PositionMask):
    """Allows the script's next token, then only end of text."""

    def __init__(self, script: list[int], eos_id: int, vocab: int) -> None:
        super().__init__(vocab)
        self.script, self.eos_id = script, eos_id

    def allowed(self, position: int) -> np.ndarray:
        allowed = np.zeros(self.vocab, dtype=bool)
        allowed[self.script[position] if position < len(self.script) else self.eos_id] = True
        return allowed


@contextmanager
def scripted_model(tokenizer, eos_id: int, rules: Sequence[tuple[str, str]]) -> Iterator[list[str]]:
    """Within the block, replies follow ``rules`` ((needle, reply text)); yields the prompts' last turns seen."""
    seen: list[str] = []
    unscripted = BatchRunner._constraint

    def constraint(runner, request):
        tail = tokenizer.decode(list(request.prompt_ids)).rsplit(USER, 1)[-1]
        seen.append(tail)
        reply = next((text for needle, text in rules if needle in tail), None)
        if reply is None:
            return unscripted(runner, request)
        script = list(tokenizer.encode(reply, add_special_tokens=False))
        return ScriptedReply(script, eos_id, runner.engine.model.args.vocab_size)

    with mock.patch.object(BatchRunner, "_constraint", constraint):
        yield seen
