"""ChatSession with tools: schemas from Python functions, calls read from the reply, run, answered, saved.

The model is a tiny random one whose picked tokens are scripted (``scripted_model``):
asked a question it writes a Qwen3 tool call; shown a tool's result (a ``tool`` turn in
the embedded template, a ``<tool_response>`` in Qwen3's) it answers.
"""

from __future__ import annotations

from typing import Literal

import pytest
from scripted_model import scripted_model
from session_kill_helper import tiny_engine

from mlx_lm.tokenizer_utils import load as load_tokenizer
from tiny_models import tiny_qwen3

from assets import QWEN3_TOKENIZER_DIR
from mlxcore.engine import Engine, KVConfig
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from sessions.tools import function_tool

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>'
TWO_CALLS = ('Two sums.\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
             '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
QWEN3_VOCAB = 151_936
ANSWER = "The sum is 19."
RULES = [("<tool_response>", ANSWER), ("two", TWO_CALLS), ("loop", CALL), ("", CALL)]


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def convert(value: float, unit: Literal["km", "mi"] = "km", note: str | None = None) -> str:
    """Convert a distance."""
    return f"{value} {unit}"


@pytest.fixture(scope="module")
def engine():
    return tiny_engine("paged", draft=False)


@pytest.fixture(scope="module", params=["embedded", "qwen3"])
def engines(request, engine):
    """The embedded template (which shows no tools), or Qwen3's own (tools block, ``<tool_response>``) on a tiny
    random model with Qwen3's vocabulary."""
    if request.param == "embedded":
        return engine
    return Engine(tiny_qwen3(0, vocab_size=QWEN3_VOCAB), load_tokenizer(QWEN3_TOKENIZER_DIR), kv=KVConfig(kind="paged"),
                  fingerprint="tiny-qwen3-vocab")


def session(engine, **kwargs) -> ChatSession:
    return ChatSession(engine, "You can add.", GenerationParams(max_tokens=400), enable_thinking=False,
                       tools=[add], **kwargs)


def test_a_functions_schema_comes_from_its_hints_and_docstring():
    assert function_tool(add) == {"type": "function", "function": {
        "name": "add", "description": "Add two whole numbers.",
        "parameters": {"type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {"type": "integer", "description": "The second number."}}}}}
    properties = function_tool(convert)["function"]["parameters"]
    assert properties["required"] == ["value"]
    assert properties["properties"] == {"value": {"type": "number"}, "unit": {"type": "string", "enum": ["km", "mi"]},
                                        "note": {"type": "string", "nullable": True}}


def test_send_returns_the_calls_and_run_tools_answers_with_their_results(engines):
    engine = engines
    chat = session(engine)
    with scripted_model(engine.tokenizer, min(engine.eos_ids), RULES):
        reply = chat.send("What is 12 + 7?")
        assert [(c.name, c.parsed_arguments()) for c in reply.tool_calls] == [("add", {"a": 12, "b": 7})]
        answer = chat.run_tools()
    assert answer == answer.content == "The sum is 19." and answer.tool_calls == ()
    assert [(m.role, m.content) for m in chat.history[-3:]] == [
        ("assistant", "<think>\n\n</think>\n\n" + CALL), ("tool", "19"), ("assistant", "<think>\n\n</think>\n\n"
                                                                               "The sum is 19.")]


def test_auto_tools_runs_parallel_calls_in_order(engine):
    chat = session(engine, auto_tools=True)
    with scripted_model(engine.tokenizer, min(engine.eos_ids), RULES):
        answer = chat.send("Do two sums")
    assert answer == "The sum is 19."
    assert [m.content for m in chat.history if m.role == "tool"] == ["3", "7"]


def test_the_step_limit_ends_a_model_that_keeps_calling(engine):
    chat = session(engine)
    loop = [("", CALL)]  # even after a result, it calls again
    with scripted_model(engine.tokenizer, min(engine.eos_ids), loop):
        chat.send("loop")
        last = chat.run_tools(max_steps=3)
    assert last.tool_calls and [m.role for m in chat.history].count("tool") == 3


def test_a_failing_or_unknown_tool_gives_the_model_an_error(engine):
    def broken(a: int, b: int) -> int:
        """Fails."""
        raise RuntimeError("disk on fire")

    chat = ChatSession(engine, None, GenerationParams(max_tokens=400), enable_thinking=False,
                       tools=[function_tool(add)])  # a schema only: nothing to run it
    with scripted_model(engine.tokenizer, min(engine.eos_ids), RULES):
        chat.send("What is 12 + 7?")
        chat.run_tools()
    assert [m.content for m in chat.history if m.role == "tool"] == [
        "Error: there is no tool 'add' to run (tools: none)."]
    broken.__name__ = "add"
    chat.set_tools([broken])
    with scripted_model(engine.tokenizer, min(engine.eos_ids), RULES):
        chat.send("What is 12 + 7?")
        chat.run_tools()
    assert [m.content for m in chat.history if m.role == "tool"][-1] == \
        "Error: add failed: RuntimeError: disk on fire"


def test_tool_turns_survive_save_and_load(engines, tmp_path):
    engine = engines
    chat = session(engine)
    with scripted_model(engine.tokenizer, min(engine.eos_ids), RULES):
        chat.send("What is 12 + 7?")
        chat.run_tools()
    chat.save(tmp_path / "tools.mlxchat")
    again = ChatSession.load(tmp_path / "tools.mlxchat", engine)
    assert again.history == chat.history
    again.set_tools([add])
    assert again.prompt_ids() == chat.prompt_ids(), "the same prompt, tools included: the cache holds it"
    assert again.last_reply() == "<think>\n\n</think>\n\nThe sum is 19."


def test_tool_turns_survive_the_session_store(engine, tmp_path):
    from sessions.store import SessionStore
    chat = session(engine)
    with scripted_model(engine.tokenizer, min(engine.eos_ids), RULES):
        chat.send("Do two sums")
        chat.run_tools()
    store = SessionStore(tmp_path / "sessions")
    try:
        info = store.save(chat)
        again = store.load(info.id, engine)
    finally:
        store.close()
    assert again.history == chat.history and [m.role for m in again.history].count("tool") == 2


def test_the_turn_after_a_tool_call_reuses_the_whole_conversation_from_the_cache(engines):
    """The reply with its call is stored as the model wrote it, so the next prompt starts with every token the
    cache holds: only the tool's result and the reply's header are computed."""
    engine = engines
    chat = session(engine)
    with scripted_model(engine.tokenizer, min(engine.eos_ids), RULES):
        chat.send("What is 12 + 7?")
        held = list(chat.caches.tokens)
        chat.run_tools()
    stats = chat.last_stats
    assert stats.reused_tokens >= len(held) - 1, (stats.reused_tokens, len(held))
    # Qwen3 writes the result as a user turn (the held reply ends at its "<|im_end|>"); thinking is off
    result_turn = ("<|im_end|>\n<|im_start|>user\n<tool_response>\n19\n</tool_response><|im_end|>\n"
                   "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert stats.prompt_tokens - stats.reused_tokens <= len(engine.tokenizer.encode(result_turn))


def test_a_result_too_large_for_the_context_is_cut_with_a_note_and_a_small_one_is_kept_whole(engine):
    from sessions.messages import Message
    chat = session(engine)
    limit = engine.token_limit()
    chat.messages += [Message("user", "Add them."), Message("assistant", '<tool_call>\n{"name": "add", '
                                                         '"arguments": {"a": 1, "b": 2}}\n</tool_call>')]
    chat.add_tool_results([""])
    base = len(chat.prompt_ids())  # the conversation with an empty result
    chat.messages.pop()
    huge = "apples and pears " * 60_000  # about a megabyte
    chat.add_tool_results([huge])
    kept = chat.messages[-1].content
    text, note = kept.rsplit("\n[cut: ", 1)
    assert huge.startswith(text) and note == f"{len(huge) - len(text)} characters]"
    assert len(chat.prompt_ids()) <= base + (limit - base) // 2, "half of the free context at most"
    chat.messages[-1:] = []
    chat.add_tool_results(["3"])
    assert chat.messages[-1] == Message("tool", "3")
