"""Errors that mean "the user (or their files) asked for something impossible".

Each carries a one-line message that says what is wrong and what to do; the CLI
and the TUI show it as it is, without a traceback.
"""


class MlxchatError(Exception):
    """Base for every error mlxchat reports to the user as a plain message."""


class ModelLoadError(MlxchatError):
    """A model could not be found, downloaded or read."""


class TokenizerMismatchError(MlxchatError):
    """A draft model does not share the target's tokenizer vocabulary."""


class PromptError(MlxchatError):
    """A prompt is empty, or longer than the model's context."""


class UsageError(MlxchatError):
    """Options that do not fit together or are out of range."""


class SystemPromptTooLongError(PromptError):
    """The system prompt does not fit in the rotating KV window (which always keeps it)."""
