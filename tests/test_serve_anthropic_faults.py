"""Anthropic's Messages API when things go wrong: a client that leaves, an engine that fails mid-stream, a full
queue. A real server whose steps are slowed (tests/serve_slow_server.py), as in test_serve_disconnect.py and
test_serve_engine_failure.py, so that a reply is still under way when the test acts.
"""

from __future__ import annotations

import threading

import anthropic
import pytest

from serve_process import MODEL, ServeProcess, assert_freed_after_close, inject_fault, poll_until

QUESTION = [{"role": "user", "content": "What is 347 + 589?"}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-anthropic-faults")
    fault = tmp / "fail-now"
    # --no-draft: a token a step, so that a reply is still under way when a test acts (a speculative round
    # emits several, and the embedded model's short replies could end first)
    with ServeProcess(tmp, "--max-running", "1", "--max-waiting", "1", "--no-draft", script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.05", "MLXCHAT_TEST_FAULT_FILE": str(fault),
                           "MLXCHAT_TEST_IGNORE_EOS": "1"}) as server:  # replies run to their cap: under way
        yield server, fault


def test_closing_a_stream_cancels_it_and_frees_its_blocks(slow):
    server, _ = slow
    before = server.metrics()
    stream = server.anthropic().messages.create(model=MODEL, max_tokens=500, messages=QUESTION, stream=True)
    deltas = 0
    for item in stream:
        deltas += item.type == "content_block_delta"
        if deltas == 5:
            break
    assert server.metrics()["mlxchat_pool_used_blocks"] > before["mlxchat_pool_used_blocks"], "it holds blocks"
    stream.close()
    assert_freed_after_close(server, before)


def test_a_full_queue_is_529_overloaded_with_retry_after(slow):
    server, _ = slow
    client = server.anthropic()
    running = client.messages.create(model=MODEL, max_tokens=60, messages=QUESTION, stream=True)
    next(iter(running))  # message_start: the request is in
    # admitted, not waiting: the stream opens before the next step admits it (on a loaded host, long enough
    # for the second request to find the queue full)
    poll_until(lambda: server.metrics()["mlxchat_running_requests"] == 1 and server.metrics()["mlxchat_queue_length"] == 0)
    waiting: list = []
    thread = threading.Thread(target=lambda: waiting.append(
        client.messages.create(model=MODEL, max_tokens=20, messages=QUESTION)))
    thread.start()
    poll_until(lambda: server.metrics()["mlxchat_queue_length"] == 1)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model=MODEL, max_tokens=20, messages=QUESTION)
    assert caught.value.status_code == 529 and int(caught.value.response.headers["retry-after"]) >= 1
    assert caught.value.body["error"]["type"] == "overloaded_error", caught.value.body
    events = list(running)
    thread.join(timeout=60)
    assert events[-1].type == "message_stop" and waiting and waiting[0].stop_reason in ("end_turn", "max_tokens")


def test_an_engine_failure_mid_stream_is_an_error_event(slow):
    server, fault = slow
    stream = server.anthropic().messages.create(model=MODEL, max_tokens=500, messages=QUESTION, stream=True)
    events = iter(stream)
    next(events)
    inject_fault(server, fault, "once")
    with pytest.raises(anthropic.APIStatusError) as caught:
        for _ in events:
            pass
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "api_error"
    assert "injected engine fault" in caught.value.body["error"]["message"]
    reply = server.anthropic().messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
    assert reply.usage.output_tokens == 5, "the engine goes on"
