"""A grammar never runs away (issue 59): schemas as clients send them (no ``additionalProperties``, no bounds on
integers, numbers or strings), through the openai SDK against `mlxchat serve` on a loopback port, on a
random-weight twin whose free output is noise (it would write digits, characters and keys until
``max_tokens``): every reply validates, holds what a JSON consumer reads (int64, finite doubles) and ends
before ``max_tokens``; a ``max_tokens`` too small for any complete reply is a 400 naming it.
"""

from __future__ import annotations

import json
import math

import jsonschema
import openai
import pytest
from serve_process import ServeProcess
from twin_fixtures import twin_06b_f32, twins_root  # noqa: F401

from mlxcore.schema_bounds import bounded

MAX_TOKENS = 48
SCHEMAS = {  # (as pydantic writes them: no additionalProperties, no bounds)
    "integer": {"type": "object", "properties": {"answer": {"type": "integer"}, "unit": {"type": "string"}},
                "required": ["answer", "unit"]},
    "numbers": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"]},
    "strings": {"type": "object", "properties": {"title": {"type": "string"},
                                                 "tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["title", "tags"]},
    "open_object": {"type": "object", "properties": {"meta": {"type": "object"}}, "required": ["meta"]},
    "objects": {"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "integer"}, "score": {"type": "number"}, "inner": {"type": "object", "properties": {
            "note": {"type": "string"}}}}, "required": ["id", "score"]}},
}
INT64 = 2**63


@pytest.fixture(scope="module")
def server(tmp_path_factory, twin_06b_f32):  # noqa: F811
    with ServeProcess(tmp_path_factory.mktemp("runaway"), pair=("--model", str(twin_06b_f32), "--no-draft")) as up:
        up.model = twin_06b_f32.name
        yield up


def ask(server, schema: dict, **kwargs):
    return server.client().chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **{"max_tokens": MAX_TOKENS, **kwargs})


def readable(value: object) -> bool:
    """What every JSON consumer reads as written: integers within int64, finite doubles, no extra keys."""
    if isinstance(value, dict):
        return all(readable(v) for v in value.values())
    if isinstance(value, list):
        return all(readable(v) for v in value)
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -INT64 <= value < INT64
    return math.isfinite(value) if isinstance(value, float) else True


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_reply_validates_and_ends_before_max_tokens(server, name):
    schema = SCHEMAS[name]
    for temperature, choices in ((0.0, 1), (0.8, 2)):
        reply = ask(server, schema, temperature=temperature, seed=7, n=choices)
        assert reply.usage.completion_tokens < MAX_TOKENS * choices, reply
        for choice in reply.choices:
            assert choice.finish_reason == "stop", f"{name}: {choice.finish_reason}: {choice.message.content!r}"
            value = json.loads(choice.message.content)
            jsonschema.validate(value, schema)
            jsonschema.validate(value, bounded(schema))  # (no keys beyond the properties, bounded values)
            assert readable(value), choice.message.content


def test_a_max_tokens_below_the_shortest_reply_is_a_400_naming_it(server):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(server, SCHEMAS["objects"] | {"minItems": 3}, max_tokens=8)
    assert "max_tokens" in str(refused.value) and "shortest reply" in str(refused.value)


def test_bounds_fill_only_what_the_schema_leaves_open():
    given = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 5}, "x": {"type": ["number", "null"], "multipleOf": 0.5},
        "s": {"type": "string", "minLength": 5000}, "e": {"type": "string", "enum": ["a"]},
        "all": {"allOf": [{"properties": {"a": {"type": "integer", "maximum": 3}}}]},
        "free": {"type": "object", "additionalProperties": True, "properties": {}}}}
    made = bounded(given)
    props = made["properties"]
    assert made["additionalProperties"] is False and "additionalProperties" not in given  # (a copy)
    assert (props["n"]["minimum"], props["n"]["maximum"]) == (5, 10**18)
    assert (props["x"]["minimum"], props["x"]["maximum"], props["x"]["multipleOf"]) == (-10**15, 10**15, 0.5)
    assert props["s"]["maxLength"] == 5000 and "maxLength" not in props["e"]
    assert "additionalProperties" not in props["all"]["allOf"][0]
    assert props["all"]["allOf"][0]["properties"]["a"] == {"type": "integer", "maximum": 3, "minimum": -10**18}
    assert props["free"]["additionalProperties"] is True


def test_a_reply_still_thinking_near_its_cap_closes_the_block_and_answers_in_time():
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from tiny_models import tiny_qwen3

    from assets import QWEN3_TOKENIZER_DIR
    from mlxcore.engine import Engine, KVConfig
    from mlxcore.grammar import json_schema
    from mlxcore.params import GenerationParams

    tokenizer = load_tokenizer(QWEN3_TOKENIZER_DIR)
    engine = Engine(tiny_qwen3(0, vocab_size=151_936), tokenizer, kv=KVConfig(kind="paged"), fingerprint="tiny")
    prompt = tokenizer.encode("<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n<think>\n",
                              add_special_tokens=False)  # (inside an open block: free until </think>)
    schema = SCHEMAS["objects"]
    final = list(engine.generate(list(prompt), engine.new_caches(), GenerationParams(max_tokens=MAX_TOKENS),
                                 grammar=json_schema(schema)))[-1]
    assert final.finish_reason == "eos", final.text
    jsonschema.validate(json.loads(final.text.split("</think>")[-1]), schema)
