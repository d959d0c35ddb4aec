"""The fields the current openai SDK's request types carry, on the chat endpoint and the Responses API, sent
through the real SDK: one with a meaning here is honoured (``reasoning_effort``), a hint or metadata with none is
accepted and named in ``X-Mlxchat-Ignored-Fields`` (and the log), and one that would change the reply and cannot
be honoured is a 400 naming it and why. (Unknown fields stay 400s: test_serve_errors.py.)"""

from __future__ import annotations

import openai
import pytest

from serve_process import MODEL, ServeProcess

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]
HINTS = {"metadata": {"app": "test"}, "store": False, "prompt_cache_key": "k-1", "prompt_cache_retention": "24h",
         "safety_identifier": "user-1", "service_tier": "auto", "verbosity": "low",
         "prediction": {"type": "content", "content": "19"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-fields"), pair=("--model", MODEL, "--no-draft")) as server:
        yield server


def ignored(raw) -> set[str]:
    return set(filter(None, raw.headers.get("x-mlxchat-ignored-fields", "").split(", ")))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_hints_are_accepted_and_named_in_a_header(server, stream):
    options = {"stream_options": {"include_usage": True, "include_obfuscation": False}} if stream else {}
    raw = server.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, max_tokens=4, temperature=0, stream=stream, logit_bias={}, modalities=["text"],
        extra_body={"prompt_cache_options": {"mode": "implicit"}}, **HINTS, **options)
    assert raw.status_code == 200
    assert ignored(raw) == set(HINTS) | {"prompt_cache_options"}
    reply = raw.parse()
    if stream:
        assert [chunk for chunk in reply if chunk.usage], "the stream ran to its usage chunk"
    else:
        assert reply.choices[0].finish_reason in ("stop", "length")
    assert "accepted and ignored (no meaning here): metadata, store" in server.log()


def test_a_request_without_hints_has_no_header(server):
    raw = server.client().chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert "x-mlxchat-ignored-fields" not in raw.headers


@pytest.mark.parametrize("effort, thinking", [("none", False), ("minimal", False), ("low", True), ("high", True)])
def test_reasoning_effort_turns_thinking_on_or_off(server, effort, thinking):
    client = server.client()
    by_effort = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0,
                                               reasoning_effort=effort)
    by_kwargs = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0,
                                               extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    assert by_effort.choices[0].message.content == by_kwargs.choices[0].message.content
    assert getattr(by_effort.choices[0].message, "reasoning_content", None) == \
        getattr(by_kwargs.choices[0].message, "reasoning_content", None)


@pytest.mark.parametrize("field, value, words", [
    ("audio", {"voice": "alloy", "format": "mp3"}, "text only"),
    ("modalities", ["text", "audio"], "text only"),
    ("logit_bias", {"15": 5}, "no per-token bias"),
    ("moderation", {"model": "omni-moderation-latest"}, "no moderation model"),
    ("web_search_options", {"search_context_size": "low"}, "no hosted tools"),
])
def test_chat_fields_that_cannot_be_honoured_are_400_saying_why(server, field, value, words):
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                                extra_body={field: value})
    assert caught.value.body["param"] == field and words in caught.value.body["message"], caught.value.body


def test_responses_hints_are_accepted_and_named_in_a_header(server):
    raw = server.client().responses.with_raw_response.create(
        model=MODEL, input="What is 12 + 7?", max_output_tokens=4, reasoning={"effort": "none"}, store=False,
        prompt_cache_key="k-1", prompt_cache_retention="24h", max_tool_calls=3, metadata={"app": "test"},
        context_management=[{"type": "compaction", "compact_threshold": 200_000}], background=False,
        extra_body={"prompt_cache_options": {"mode": "implicit"}})
    assert raw.status_code == 200
    assert ignored(raw) == {"store", "prompt_cache_key", "prompt_cache_retention", "max_tool_calls", "metadata",
                            "context_management", "prompt_cache_options"}
    assert raw.parse().status in ("completed", "incomplete")


@pytest.mark.parametrize("field, value, words", [
    ("background", True, "reply comes on this request"),
    ("moderation", {"model": "omni-moderation-latest"}, "no moderation model"),
    ("prompt", {"id": "pmpt_1"}, "stored prompt template"),
    ("top_logprobs", 3, "chat endpoint's logprobs"),
])
def test_responses_fields_that_cannot_be_honoured_are_400_saying_why(server, field, value, words):
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().responses.create(model=MODEL, input="hi", max_output_tokens=2, extra_body={field: value})
    assert caught.value.body["param"] == field and words in caught.value.body["message"], caught.value.body
