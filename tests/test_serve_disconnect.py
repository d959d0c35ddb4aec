"""A client that goes away stops its generation, streaming or not, and its KV blocks are free right after.

The server's steps are slowed (tests/serve_slow_server.py) so that a reply is
still being generated when the client leaves. After the client closes the
connection, ``/metrics`` must show the request cancelled and the pool's used
blocks back to where they were before it, within one second.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from serve_process import MODEL, ServeProcess, poll_until

QUESTION = [{"role": "user", "content": "What is 347 + 589?"}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-disconnect"), script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.05"}) as server:
        yield server


def freed_within(server, before: dict[str, float]) -> float:
    """Seconds until /metrics shows one more cancelled request and the used blocks back to ``before``'s."""
    def back() -> bool:
        now = server.metrics()
        return now["mlxchat_requests_cancelled_total"] == before["mlxchat_requests_cancelled_total"] + 1 and \
            now["mlxchat_pool_used_blocks"] == before["mlxchat_pool_used_blocks"] and \
            now["mlxchat_running_requests"] == 0
    return poll_until(back, limit=5)


def test_closing_a_stream_after_5_tokens_cancels_it(server):
    before = server.metrics()
    stream = server.client().chat.completions.create(model=MODEL, messages=QUESTION, stream=True, max_tokens=500)
    tokens = 0
    for chunk in stream:
        delta = chunk.choices[0].delta
        tokens += bool(delta.content or getattr(delta, "reasoning_content", None))
        if tokens == 5:
            break
    assert server.metrics()["mlxchat_pool_used_blocks"] > before["mlxchat_pool_used_blocks"], "it holds blocks"
    stream.close()
    gone = time.monotonic()
    seconds = freed_within(server, before)
    assert time.monotonic() - gone < 1.0, f"blocks freed {seconds:.2f} s after the client left"
    finished = server.metrics()["mlxchat_requests_finished_total"]
    assert finished == before["mlxchat_requests_finished_total"], "it was cancelled, not run to its end"


def test_leaving_a_non_streaming_request_cancels_it(server):
    before = server.metrics()
    body = json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 500}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    poll_until(lambda: server.metrics()["mlxchat_generated_tokens_total"]
               >= before["mlxchat_generated_tokens_total"] + 5, limit=30)
    sock.close()
    gone = time.monotonic()
    freed_within(server, before)
    assert time.monotonic() - gone < 1.0
    assert "finish=client gone" in server.log()
