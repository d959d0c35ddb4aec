"""Every error status of `mlxchat serve`, with its message, as the `openai` client (or a raw request) meets it.

400 (bad JSON, wrong type, out of range, an unsupported field, JSON modes, a
prompt over the context), 401 (API key), 404 (model, route), 413 (body), 429
with Retry-After (queue full; the requests it did take still complete).
Engine failure (500, /health 503) is in test_serve_engine_failure.py.
"""

from __future__ import annotations

import threading

import openai
import pytest

from serve_process import MODEL, ServeProcess, http, poll_until

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-errors")) as server:
        yield server


def refused(call, status: int) -> dict:
    """The error body of ``call()``, which must fail with ``status``."""
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    assert caught.value.status_code == status, caught.value
    return caught.value.body


def chat(server, **fields):
    return server.client().chat.completions.create(model=fields.pop("model", MODEL),
                                                   messages=fields.pop("messages", QUESTION), **fields)


def test_bad_json_is_400(server):
    status, _, body = http("POST", f"{server.url}/v1/chat/completions", b'{"model": "mini-target", "messages": [')
    assert status == 400 and "not valid JSON" in body["error"]["message"]


@pytest.mark.parametrize("field, value, words", [
    ("max_tokens", "many", "max_tokens: Input should be a valid integer"),
    ("temperature", 5, "temperature: Input should be less than or equal to 2"),
    ("top_p", 0, "top_p: Input should be greater than 0"),
    ("n", 99, "n: Input should be less than or equal to 16"),
    ("stream", "yes", "stream: Input should be a valid boolean"),
    ("priority", "urgent", "priority: Input should be 'low', 'normal' or 'high'"),
])
def test_wrong_type_or_range_is_400_naming_the_field(server, field, value, words):
    error = refused(lambda: chat(server, extra_body={field: value}), 400)
    assert words in error["message"] and error["param"] == field


def test_unsupported_fields_are_400_never_ignored(server):
    error = refused(lambda: chat(server, extra_body={"functions": [{"name": "f"}]}), 400)  # tools' old form
    assert error["param"] == "functions" and "Unsupported field 'functions'" in error["message"]
    error = refused(lambda: chat(server, messages=[{"role": "user", "content": "hi", "name": "ada"}]), 400)
    assert error["param"] == "messages.0.name"
    error = refused(lambda: chat(server, frequency_penalty=0.5), 400)
    assert "frequency_penalty is not supported" in error["message"]


@pytest.mark.parametrize("fmt", [{"type": "json_schema"}, {"type": "json_object", "json_schema": {"name": "x", "schema": {}}},
                                 {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}])
def test_json_response_formats_that_are_not_whole_are_refused_with_why(server, fmt):
    error = refused(lambda: chat(server, response_format=fmt), 400)
    assert ("needs a json_schema" in error["message"] or "Unimplemented" in error["message"]), error


def test_a_prompt_over_the_context_is_400(server):
    long = [{"role": "user", "content": "the quick brown fox " * 1500}]  # ~6,000 tokens; the context is 4,096
    for stream in (False, True):  # a stream is refused before its 200 too
        error = refused(lambda stream=stream: chat(server, messages=long, stream=stream), 400)
        assert error["code"] == "context_length_exceeded" and "4096" in error["message"]
    assert "19" in chat(server, extra_body={"chat_template_kwargs": {"enable_thinking": False}}) \
        .choices[0].message.content, "the server answers the next request"


def test_unknown_model_and_route_are_404(server):
    error = refused(lambda: chat(server, model="gpt-4"), 404)
    assert error["code"] == "model_not_found" and "'mini-target'" in error["message"]
    status, _, body = http("GET", f"{server.url}/v1/nothing")
    assert status == 404 and body["error"]["message"] == "No route GET /v1/nothing."


def test_a_body_over_the_limit_is_413(server):
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (5 * 2**20)}]}
    status, _, body = http("POST", f"{server.url}/v1/chat/completions", big)
    assert status == 413 and "limit of 4,194,304 bytes" in body["error"]["message"]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """One request runs, one waits, the next is refused; steps slowed so that they overlap."""
    with ServeProcess(tmp_path_factory.mktemp("serve-guarded"), "--max-running", "1", "--max-waiting", "1",
                      api_key="sesame", script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.02"}) as server:
        yield server


def test_api_key_wrong_or_missing_is_401(guarded):
    error = refused(lambda: guarded.client(api_key="wrong").models.list(), 401)
    assert error["message"] == "Wrong API key."
    status, _, body = http("GET", f"{guarded.url}/v1/models")
    assert status == 401 and "Missing API key" in body["error"]["message"]
    assert http("GET", f"{guarded.url}/health")[0] == 200, "the health probe needs no key"
    assert guarded.client(api_key="sesame").models.list().data[0].id == MODEL


def test_a_full_queue_is_429_with_retry_after(guarded):
    client = guarded.client()
    running = client.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, max_tokens=40)
    first = next(running)  # the first request is decoding
    # admitted, not waiting: the stream opens before the next step admits it (on a loaded host, long enough
    # for the second request to find the queue full)
    poll_until(lambda: guarded.metrics()["mlxchat_running_requests"] == 1 and guarded.metrics()["mlxchat_queue_length"] == 0)
    waiting: list = []
    thread = threading.Thread(target=lambda: waiting.append(
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40)))
    thread.start()
    poll_until(lambda: guarded.metrics()["mlxchat_queue_length"] == 1)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40)
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert "requests are waiting already" in caught.value.body["message"]
    chunks = [first, *running]
    thread.join(timeout=60)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length"), "the running request completed"
    assert waiting and waiting[0].choices[0].finish_reason in ("stop", "length"), "so did the waiting one"


