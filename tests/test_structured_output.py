"""Constrained decoding on a random-weight model with Qwen3's real vocabulary and tokenizer: its free output
is noise, so every reply that validates does so because of the grammar.

Twenty schemas (``structured_schemas.py``), each greedy and sampled, with and without the draft, alone
and in a batch of 8; a named tool choice always gives a call to that tool; log-probabilities are the
constrained distribution's; a failing matcher ends the reply with an error.
"""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from structured_schemas import SCHEMAS
from tiny_models import tiny_qwen3

from assets import QWEN3_TOKENIZER_DIR
from mlxcore import decode_speculative, grammar
from mlxcore.batching.constraints import Constraint, GrammarError
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from bench.draft_lengths import FixedDraftLength
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.params import GenerationParams
from mlxcore.reply_parser import ReplyParser

QWEN3_VOCAB = 151_936
PROMPT = "<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
GREEDY = GenerationParams(max_tokens=160)
SAMPLED = GenerationParams(max_tokens=160, temperature=0.8, top_k=50, top_p=0.95, seed=3)
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                             "b": {"type": "integer", "minimum": 0, "maximum": 999}},
            "required": ["a", "b"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "clock", "parameters": {
            "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
            "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(QWEN3_TOKENIZER_DIR)


@pytest.fixture(scope="module")
def engine(tokenizer):
    made = Engine(tiny_qwen3(0, vocab_size=QWEN3_VOCAB), tokenizer, kv=KVConfig(kind="paged"),
                  draft_model=tiny_qwen3(1, vocab_size=QWEN3_VOCAB), fingerprint="tiny-qwen3-vocab",
                  draft_fingerprint="tiny-qwen3-vocab-draft")
    made.draft_control = FixedDraftLength(4)  # a round every step
    return made


def prompt_ids(tokenizer) -> list[int]:
    return list(tokenizer.encode(PROMPT, add_special_tokens=False))


def reply(engine, tokenizer, constraint: grammar.Grammar, params: GenerationParams, draft: bool):
    caches = engine.new_caches()
    if not draft:
        caches.draft.release()
        caches.draft = None
    events = list(engine.generate(prompt_ids(tokenizer), caches, params, grammar=constraint))
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return final, [e for e in events if isinstance(e, TokenEvent)]


def assert_valid(final: FinalEvent, schema: dict, name: str) -> None:
    assert final.finish_reason == "eos", f"{name}: ended by {final.finish_reason}: {final.text!r}"
    jsonschema.validate(json.loads(final.text), schema)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft", [False, True], ids=["plain", "draft"])
def test_twenty_schemas_out_of_twenty_validate_alone(engine, tokenizer, params, draft):
    for name, schema in SCHEMAS.items():
        final, _ = reply(engine, tokenizer, grammar.json_schema(schema), params, draft)
        assert_valid(final, schema, name)
        if draft:
            assert final.stats.draft_proposed > 0, f"{name}: the draft never proposed"


@pytest.mark.parametrize("constrain_draft", [True, False], ids=["draft-masked", "draft-free"])
def test_greedy_under_a_grammar_is_the_same_with_the_draft_as_without(engine, tokenizer, constrain_draft,
                                                                     monkeypatch):
    """The target's masked rows decide every token at temperature 0, whatever the draft proposes (under the
    grammar's masks or freely)."""
    monkeypatch.setattr(decode_speculative, "CONSTRAIN_DRAFT", constrain_draft)
    for name in ("nested", "array_of_objects", "any_of_objects", "number_range"):
        plain = reply(engine, tokenizer, grammar.json_schema(SCHEMAS[name]), GREEDY, draft=False)[0]
        drafted = reply(engine, tokenizer, grammar.json_schema(SCHEMAS[name]), GREEDY, draft=True)[0]
        assert drafted.text == plain.text, name


def run_batch(batch: LocalBatch, handles: list) -> dict:
    """Step ``batch`` until it is idle; each handle's final event, by request id."""
    finals = {}
    while batch.busy:
        batch.step()
        for handle in handles:
            finals.update((handle.request_id, e) for e in drain(handle) if isinstance(e, FinalEvent))
    return finals


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_twenty_schemas_validate_in_batches_of_eight_beside_a_free_reply(engine, tokenizer, params):
    names = list(SCHEMAS)
    for start in range(0, len(names), 7):
        batch = LocalBatch(engine)
        group = names[start:start + 7]
        handles = [batch.submit(Request(tuple(prompt_ids(tokenizer)), params, use_draft=False,
                                        grammar=grammar.json_schema(SCHEMAS[n])))[0] for n in group]
        free = batch.submit(Request(tuple(prompt_ids(tokenizer)), GenerationParams(max_tokens=20), use_draft=False))[0]
        finals = run_batch(batch, handles + [free])
        assert batch.runner.tally.largest_batch == len(group) + 1
        for name, handle in zip(group, handles):
            assert_valid(finals[handle.request_id], SCHEMAS[name], name)
        assert finals[free.request_id].stats.generated_tokens == 20  # the unconstrained row went on freely


def test_constrained_replies_drafting_side_by_side_equal_each_alone_without_the_draft(engine, tokenizer):
    """Four schemas' replies in one batch, each drafting (its rounds as rows of the batch's pass,
    ``spec_rows.py``) beside a free reply that drafts too: each text as the reply alone without the draft."""
    names = ["nested", "array_of_objects", "any_of_objects", "number_range"]
    batch = LocalBatch(engine)
    handles = [batch.submit(Request(tuple(prompt_ids(tokenizer)), GREEDY, grammar=grammar.json_schema(SCHEMAS[n])))[0]
               for n in names]
    free = batch.submit(Request(tuple(prompt_ids(tokenizer)), GenerationParams(max_tokens=20)))[0]
    finals = run_batch(batch, handles + [free])
    assert batch.runner.tally.largest_batch == len(names) + 1
    for name, handle in zip(names, handles):
        final = finals[handle.request_id]
        assert final.stats.draft_proposed > 0, f"{name}: it drafted in the batch"
        assert final.text == reply(engine, tokenizer, grammar.json_schema(SCHEMAS[name]), GREEDY, draft=False)[0].text
        assert_valid(final, SCHEMAS[name], name)


def test_constrained_replies_with_prompt_lookup_equal_each_without(engine, tokenizer):
    """Prompt lookup's proposals under a grammar: the target's masked rows decide every token, so each
    reply's text is the same as without a drafter (and lookup proposed: JSON repeats its keys' text)."""
    lookup = Engine(engine.model, tokenizer, kv=KVConfig(kind="paged"), prompt_lookup=True)
    lookup.draft_control = FixedDraftLength(4)
    proposed = 0
    for name in ("nested", "array_of_objects", "any_of_objects", "number_range"):
        final = next(e for e in lookup.generate(prompt_ids(tokenizer), lookup.new_caches(), GREEDY,
                                                grammar=grammar.json_schema(SCHEMAS[name]))
                     if isinstance(e, FinalEvent))
        assert final.text == reply(engine, tokenizer, grammar.json_schema(SCHEMAS[name]), GREEDY, draft=False)[0].text
        proposed += final.stats.draft_proposed
    assert proposed > 0


def test_a_constrained_batch_row_leaves_its_neighbours_greedy_tokens_as_they_were(engine, tokenizer):
    ids = tuple(prompt_ids(tokenizer))
    params = GenerationParams(max_tokens=12)
    alone = LocalBatch(engine)
    handle = alone.submit(Request(ids, params, use_draft=False))[0]
    alone.run_until(handle.finished.is_set)
    expected = [e.token for e in drain(handle) if isinstance(e, TokenEvent)]
    batch = LocalBatch(engine)
    batch.submit(Request(ids, GREEDY, use_draft=False, grammar=grammar.json_schema(SCHEMAS["deep"])))
    free = batch.submit(Request(ids, params, use_draft=False))[0]
    batch.run_until(free.finished.is_set)
    assert [e.token for e in drain(free) if isinstance(e, TokenEvent)] == expected


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft", [False, True], ids=["plain", "draft"])
def test_a_named_tool_choice_always_calls_that_tool(engine, tokenizer, params, draft):
    for name in ("add", "clock"):
        final, _ = reply(engine, tokenizer, grammar.tool_call_grammar(TOOLS, name), params, draft)
        parser = ReplyParser(TOOLS)
        parser.feed(final.text)
        parser.finish()
        assert [call.name for call in parser.calls] == [name], final.text
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
        jsonschema.validate(json.loads(parser.calls[0].arguments), schema)


def test_a_tool_whose_parameters_hold_definitions_is_called_with_arguments_that_validate(engine, tokenizer):
    """A pydantic model's parameters keep nested models in ``$defs``, referred to from the root
    (instructor's tools mode, pydantic-ai): the call's grammar resolves them. Before: a 400, the pointer
    ``#/$defs/Place`` not found under ``arguments``."""
    parameters = {"type": "object", "properties": {"place": {"$ref": "#/$defs/Place"}}, "required": ["place"],
                  "additionalProperties": False,
                  "$defs": {"Place": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                      "required": ["zone"], "additionalProperties": False}}}
    tools = [{"type": "function", "function": {"name": "where", "parameters": parameters}}]
    final, _ = reply(engine, tokenizer, grammar.tool_call_grammar(tools, "where"), GREEDY, draft=False)
    parser = ReplyParser(tools)
    parser.feed(final.text)
    parser.finish()
    assert [call.name for call in parser.calls] == ["where"], final.text
    jsonschema.validate(json.loads(parser.calls[0].arguments), parameters)


def test_session_send_with_a_pydantic_model_or_a_schema_returns_json_that_validates(engine):
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field

    from sessions.chat_session import ChatSession

    class Order(BaseModel):
        model_config = ConfigDict(extra="forbid")
        item: Literal["tea", "cake"]
        count: int = Field(ge=1, le=9)
        note: str = Field(max_length=10)

    session = ChatSession(engine, params=GenerationParams(max_tokens=120))
    session.enable_thinking = False
    reply = session.send("Order something.", schema=Order)
    Order.model_validate_json(reply)
    assert session.messages[-1].content.endswith(reply)  # the JSON is the turn's answer in the history
    jsonschema.validate(json.loads(session.send("Again.", schema=SCHEMAS["refs"])), SCHEMAS["refs"])
    with pytest.raises(ValueError, match="Unimplemented"):
        session.send("Once more.", schema={"not": {}})


def test_log_probabilities_are_the_constrained_distributions(engine, tokenizer):
    """Every token of a ``const`` object is forced: probability 1 under the grammar (the free model gives
    each about 1 / 150,000)."""
    final, tokens = reply(engine, tokenizer, grammar.json_schema(SCHEMAS["const"]), GREEDY, draft=False)
    assert json.loads(final.text) == {"version": 2, "kind": "point"}
    assert all(math.isclose(t.logprob, 0.0, abs_tol=1e-4) for t in tokens), [t.logprob for t in tokens]


def test_a_schema_llguidance_cannot_compile_is_a_value_error_naming_the_construct():
    with pytest.raises(ValueError, match="not"):
        grammar.json_schema({"type": "object", "not": {"required": ["a"]}})
    with pytest.raises(ValueError, match="look-around"):
        grammar.json_schema({"type": "string", "pattern": "(?<=a)b"})
    with pytest.raises(ValueError, match="not one of the tools"):
        grammar.tool_call_grammar(TOOLS, "subtract")


def test_a_matcher_that_fails_ends_the_reply_with_its_error(engine, tokenizer, monkeypatch):
    real, calls = Constraint.fill, []

    def failing(self, bits):
        calls.append(1)
        if len(calls) == 4:
            raise GrammarError("The JSON schema grammar failed: test")
        real(self, bits)
    monkeypatch.setattr(Constraint, "fill", failing)
    for draft in (False, True):
        calls.clear()
        with pytest.raises(GrammarError, match="test"):
            reply(engine, tokenizer, grammar.json_schema(SCHEMAS["deep"]), GREEDY, draft)


def test_thinking_stays_free_until_the_block_closes(engine, tokenizer):
    json_grammar = grammar.json_schema(SCHEMAS["enum"])
    header = list(tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
    think, close = (tokenizer.encode(t, add_special_tokens=False)[0] for t in ("<think>", "</think>"))
    constraint = Constraint(json_grammar, tokenizer, QWEN3_VOCAB, engine.eos_ids, header)
    words = __import__("numpy").zeros((QWEN3_VOCAB + 31) // 32, dtype="int32")
    constraint.fill(words)
    assert words.any() and words[think // 32] & (1 << think % 32)  # the model may open a block, or answer
    constraint.catch_up([think, 1234, 5678])
    constraint.fill(words)
    assert (words == -1).all()  # free inside the block
    answer = list(tokenizer.encode('"red"', add_special_tokens=False))
    constraint.catch_up([think, 1234, 5678, close] + answer)
    assert constraint.matcher.is_accepting()
    constraint.rollback(len(answer) + 2)  # back inside the block: free again, and the matcher at its start
    constraint.fill(words)
    assert (words == -1).all()
    constraint.catch_up([think, 1234, 5678, close] + answer)
    assert constraint.matcher.is_accepting()


def test_ask_json_schema_answers_with_json_that_validates(tmp_path):
    """`mlxchat ask --json-schema FILE` on the embedded pair (thinking on: it thinks, then answers in the schema)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    schema = SCHEMAS["any_of_objects"]
    (tmp_path / "shape.json").write_text(json.dumps(schema))
    (tmp_path / "bad.json").write_text(json.dumps({"not": {}}))
    root = Path(__file__).resolve().parent.parent

    def ask(*args):
        return subprocess.run([sys.executable, "-m", "app.cli", "ask", *args], cwd=root, capture_output=True,
                              text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    result = ask("--json-schema", str(tmp_path / "shape.json"), "--max-tokens", "400", "Describe a shape.")
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(result.stdout), schema)
    refused = ask("--json-schema", str(tmp_path / "bad.json"), "hi")
    assert refused.returncode == 2 and "Unimplemented keys" in refused.stderr and "Traceback" not in refused.stderr
