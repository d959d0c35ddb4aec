"""Typed errors of the batching scheduler."""

from __future__ import annotations

from mlxcore.errors import MlxchatError, PromptError


class OverloadedError(MlxchatError):
    """The scheduler takes no more requests now (its queue is full, or the KV budget cannot hold the
    prompt next to what runs); ``retry_after`` says how many seconds to wait before trying again."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PromptTooLongError(PromptError):
    """A prompt longer than the model's context, or than the whole KV budget can ever hold."""
