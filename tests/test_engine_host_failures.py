"""The engine host's Failure events: the code a UI acts on, for each kind of error, and when one is fatal."""

from __future__ import annotations

import pytest

from app.engine_host import protocol as p
from app.engine_host.failure_text import SideBySideError, failure_code, failure_event
from mlxcore import MlxchatError, ModelLoadError, PromptError, SystemPromptTooLongError
from mlxcore.batching.errors import OverloadedError
from mlxcore.errors import TokenizerMismatchError
from mlxcore.kv.errors import PoolExhaustedError
from sessions.errors import SessionFileError, SessionInUseError, SessionNotFoundError, SessionSaveError

Code = p.FailureCode


@pytest.mark.parametrize("error, code", [
    (SystemPromptTooLongError("long"), Code.SYSTEM_PROMPT_TOO_LONG), (SideBySideError("n"), Code.SIDE_BY_SIDE),
    (PromptError("empty"), Code.PROMPT), (ModelLoadError("x"), Code.MODEL_LOAD),
    (TokenizerMismatchError("x"), Code.DRAFT_MISMATCH), (PoolExhaustedError("x"), Code.CACHE_FULL),
    (OverloadedError("x"), Code.OVERLOADED), (SessionNotFoundError("x"), Code.NOT_FOUND),
    (SessionInUseError("x"), Code.IN_USE), (SessionSaveError("x"), Code.NOT_SAVED),
    (SessionFileError("x"), Code.SESSION_FILE), (MlxchatError("x"), Code.ERROR), (KeyError("x"), Code.UNEXPECTED),
])
def test_each_kind_of_error_has_its_code(error, code):
    assert failure_code(error) is code
    assert failure_event(error, loaded=True).code is code


def test_a_refused_message_comes_back_and_only_a_failed_first_open_is_fatal():
    refused = failure_event(PromptError("The message is empty."), loaded=True, command=p.Send("  "))
    assert (refused.returned_text, refused.fatal) == ("  ", False)
    assert failure_event(ModelLoadError("no such model"), loaded=False, command=p.Open()).fatal
    assert not failure_event(ModelLoadError("no such model"), loaded=True, command=p.Open()).fatal
    bug = failure_event(KeyError("x"), loaded=False)
    assert bug.fatal and bug.title == "Unexpected error" and "KeyError" in bug.message
