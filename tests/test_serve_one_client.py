"""What one client can do to `mlxchat serve` (issue 31, findings 1, 3, 4, 5 and 6), as it was found: a real
server with the default draft on a loopback port, real HTTP clients. After every test the server still
answers a normal request as it did when fresh, and its pool goes back to idle (``assert_still_serves``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from serve_process import MODEL, ServeProcess, assert_still_serves, http, normal_reply, poll_until

pytestmark = pytest.mark.slow

CONTEXT = 4096  # the embedded target's context (config.json max_position_embeddings)
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def long_text(words: int) -> str:
    return " ".join(f"item {i % 97} is fine." for i in range(words))


# --max-kv 2048: a reply that outgrows the pool (finding 1) ------------------------------------------------

@pytest.fixture(scope="module")
def small_kv(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("small-kv"), "--max-kv", "2048") as server:
        yield server, normal_reply(server)


def test_a_reply_that_outgrows_the_kv_cache_ends_with_length_and_the_engine_lives(small_kv):
    server, reference = small_kv
    status, _, body = http("POST", f"{server.url}/v1/completions",
                           {"model": MODEL, "prompt": "Hello", "max_tokens": 3000, "temperature": 0,
                            "ignore_eos": True})
    assert status == 200, body
    used = body["usage"]  # this reply goes on to the end of the pool
    assert body["choices"][0]["finish_reason"] == "length"
    assert 2048 - 32 <= used["prompt_tokens"] + used["completion_tokens"] <= 2048, used
    metrics = server.metrics()
    assert metrics["mlxchat_engine_alive"] == 1 and metrics["mlxchat_requests_failed_total"] == 0
    assert_still_serves(server, reference)


def test_a_request_beside_a_restored_chat_that_fills_the_pool_does_not_kill_the_engine(small_kv):
    server, reference = small_kv
    chat = [{"role": "user", "content": long_text(180)}, {"role": "assistant", "content": "Noted."}]
    status, _, saved = http("POST", f"{server.url}/v1/sessions/x/save", {"messages": chat, **NO_THINK})
    assert status == 200 and saved["cached_tokens"] > 1000, saved
    status, _, restored = http("POST", f"{server.url}/v1/sessions/x/restore")
    assert status == 200, restored
    held = server.metrics()["mlxchat_pool_used_blocks"]
    assert held >= saved["cached_tokens"] // 16
    # "Hello" goes on to the end of the pool: here it meets the pinned chat's blocks first
    status, _, body = http("POST", f"{server.url}/v1/completions",
                           {"model": MODEL, "prompt": "Hello", "max_tokens": 3000, "temperature": 0,
                            "ignore_eos": True})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] <= 2048 - held * 16
    status, _, body = http("POST", f"{server.url}/v1/completions",
                           {"model": MODEL, "prompt": long_text(120), "max_tokens": 50, "temperature": 0})
    assert status == 429 and body["error"]["code"] == "overloaded", body  # a prompt that cannot fit beside it
    assert "2,048 tokens" in body["error"]["message"]
    assert server.metrics()["mlxchat_engine_alive"] == 1
    assert_still_serves(server, reference, held_blocks=held)


# the default KV: the context, fairness, saves (findings 4, 5, 6) -------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("one-client"), "--max-running", "8") as server:
        yield server, normal_reply(server)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_max_tokens_never_runs_past_the_context(server, endpoint):
    server, reference = server
    client = server.client()
    if endpoint == "completions":
        reply = client.completions.create(model=MODEL, prompt=[7] * (CONTEXT - 14), max_tokens=200, temperature=0)
    else:
        def prompt_tokens(words: int) -> int:
            return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text(words)}],
                                                  max_tokens=1, extra_body=NO_THINK).usage.prompt_tokens

        words = (CONTEXT - 40) * 100 // prompt_tokens(100)
        while prompt_tokens(words) >= CONTEXT - 10:  # a conversation just short of the context
            words -= 1
        text = long_text(words)
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                               max_tokens=200, temperature=0, extra_body=NO_THINK)
    used = reply.usage
    assert used.prompt_tokens + 200 > CONTEXT + 40, used  # asked well past the context
    assert used.prompt_tokens + used.completion_tokens <= CONTEXT, used
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert_still_serves(server, reference)


def test_a_normal_request_is_answered_while_an_n16_request_runs(server):
    server, reference = server
    client = server.client()
    many = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=600, n=16,
                                     temperature=1.0, seed=3, stream=True)
    seen = {"chunks": 0, "done": False, "running": []}

    def read_many() -> None:
        for _ in many:
            seen["chunks"] += 1
        seen["done"] = True

    reader = threading.Thread(target=read_many)
    reader.start()
    poll_until(lambda: seen["chunks"] >= 8)
    watching = threading.Event()

    def watch_running() -> None:
        while not watching.is_set():
            seen["running"].append(server.metrics()["mlxchat_running_requests"])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_running)
    watcher.start()
    before = seen["chunks"]
    normal = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 12 + 7?"}],
                                            max_tokens=24, temperature=0, stream=True, extra_body=NO_THINK)
    first = next(iter(normal))
    waited_for = seen["chunks"] - before  # the n=16 request's tokens sent while the normal one waited
    rest = list(normal)
    normal_done_first = not seen["done"]
    reader.join(timeout=120)
    watching.set()
    watcher.join()
    assert first and rest and rest[-1].choices[0].finish_reason in ("stop", "length")
    assert normal_done_first, "the normal request ended while the n=16 request still ran"
    assert waited_for < 64, f"the normal request waited behind {waited_for} tokens of the n=16 request"
    assert max(seen["running"]) <= 8, f"{max(seen['running'])} sequences ran under --max-running 8"
    assert_still_serves(server, reference)


def test_saving_a_long_chat_over_http_does_not_freeze_a_stream(server):
    server, reference = server
    client = server.client()
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=2000, temperature=1.0,
                                       seed=5, stream=True)
    arrivals: list[float] = []

    def read() -> None:
        for _ in stream:
            arrivals.append(time.monotonic())

    reader = threading.Thread(target=read)
    reader.start()
    poll_until(lambda: len(arrivals) >= 4)
    chat = [{"role": "user", "content": long_text(470)}, {"role": "assistant", "content": "Noted."}]
    prompts_before = server.metrics()["mlxchat_prompt_tokens_total"]
    start = time.monotonic()
    status, _, saved = http("POST", f"{server.url}/v1/sessions/long/save", {"messages": chat, **NO_THINK})
    end = time.monotonic()
    streamed = sum(start <= t <= end for t in arrivals)
    still_running = reader.is_alive()
    reader.join(timeout=120)
    assert status == 200 and saved["cached_tokens"] > 3000, saved
    # the save was read by the scheduler, as a prompt (not in one engine call beside it) ...
    assert server.metrics()["mlxchat_prompt_tokens_total"] - prompts_before >= saved["cached_tokens"]
    # ... so the stream went on while it was read (a save read in one engine call beside the stream would let
    # one token through at most). The store write that ends a save runs on the engine thread: the stream
    # pauses for it (docs/serve.md#sessions-over-http), so the count is of tokens, not of the longest gap.
    if still_running and end - start >= 0.2:
        assert streamed >= 3, f"{streamed} tokens streamed during a {end - start:.2f} s save"
    assert_still_serves(server, reference)


# clients that never read (finding 3) ----------------------------------------------------------------------

OTHER_BOUND = 100 * 2**20  # what six non-reading n=16 streams may add to the server's memory beside the KV pool


def open_unread_stream(server: ServeProcess, n: int = 16, max_tokens: int = 800) -> socket.socket:
    """A streaming request (top 20 logprobs: large events) whose response is never read."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}],
                       "n": n, "logprobs": True, "top_logprobs": 20, "max_tokens": max_tokens, "temperature": 1.0,
                       "stream": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def unread_server(tmp_path_factory, stall: int):
    """Replies of 800 tokens, as users' are (the embedded model's end sooner), with ``--stall-timeout``."""
    return ServeProcess(tmp_path_factory.mktemp("unread"), "--stall-timeout", str(stall), script="serve_slow_server.py",
                        env={"MLXCHAT_TEST_IGNORE_EOS": "1"})


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    with unread_server(tmp_path_factory, 300) as server:
        yield server, normal_reply(server)


def test_clients_that_never_read_are_paused_and_memory_stays_bounded(patient):
    server, reference = patient
    pid = server.process.pid
    before, kv_before = rss_bytes(pid), server.metrics()["mlxchat_kv_bytes"]
    socks = [open_unread_stream(server) for _ in range(6)]
    try:
        generated = [-1.0]

        def paused() -> bool:  # nothing generated for a second while replies run: they wait for their readers
            now = server.metrics()
            still, generated[0] = now["mlxchat_generated_tokens_total"] == generated[0], \
                now["mlxchat_generated_tokens_total"]
            return still and now["mlxchat_running_requests"] > 0

        poll_until(paused, limit=240, every=1.0)
        kv = server.metrics()["mlxchat_kv_bytes"] - kv_before  # the KV pool is budgeted apart (--max-kv)
        other = rss_bytes(pid) - before - kv
        assert other < OTHER_BOUND, f"six clients that do not read added {other / 2**20:.0f} MiB beside the KV"
    finally:
        for sock in socks:
            sock.close()  # they leave: every choice is cancelled, the blocks go back
    assert_still_serves(server, reference)


@pytest.fixture(scope="module")
def stalling(tmp_path_factory):
    with unread_server(tmp_path_factory, 4) as server:
        yield server, normal_reply(server)


def test_a_client_that_never_reads_is_cancelled_after_the_stall_timeout(stalling):
    server, reference = stalling
    cancelled = server.metrics()["mlxchat_requests_cancelled_total"]
    sock = open_unread_stream(server, n=2, max_tokens=3500)  # more than the socket buffers hold
    try:
        poll_until(lambda: server.metrics()["mlxchat_requests_cancelled_total"] - cancelled >= 2, limit=120)
        assert server.metrics()["mlxchat_running_requests"] == 0, "its blocks are freed with the socket still open"
    finally:
        sock.close()
    assert_still_serves(server, reference)
