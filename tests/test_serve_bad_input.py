"""What a clumsy or hostile client sends `mlxchat serve` (issue 31): a clear 400 (or 401, 408), never a 500 or a
traceback; a huge prompt refused before it is tokenized; a stalled body timed out; bad options refused at start.
After each test the server still answers a normal request as when fresh, and its pool is idle.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from random import Random

import openai
import pytest

from serve_process import MODEL, ROOT, ServeProcess, assert_still_serves, free_port, http, normal_reply

from app.serve.choices import ChoiceState
from mlxcore.events import TokenEvent

CHAT = "/v1/chat/completions"
BODY_TIMEOUT_S = 1.0  # the guarded server's --read-timeout: for a request's head, and within its body

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-bad-input")) as server:
        server.reference = normal_reply(server)
        yield server


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """With an API key and a short wait for a stalled body."""
    with ServeProcess(tmp_path_factory.mktemp("serve-bad-input-guarded"), "--read-timeout", str(BODY_TIMEOUT_S),
                      api_key="sesame") as server:
        server.reference = normal_reply(server)
        yield server


@pytest.fixture(autouse=True)
def still_serves(request):
    yield
    for name in ("server", "guarded"):
        if name in request.fixturenames:
            served = request.getfixturevalue(name)
            assert_still_serves(served, served.reference)


def raw_chat(server, content_json: str) -> tuple[int, dict]:
    """A chat request whose user message is ``content_json`` as written in the JSON text."""
    body = f'{{"model": "{MODEL}", "max_tokens": 4, "messages": [{{"role": "user", "content": {content_json}}}]}}'
    status, _, reply = http("POST", server.url + CHAT, body.encode())
    return status, reply


def test_a_lone_surrogate_in_a_message_is_400_naming_it(server):
    status, body = raw_chat(server, '"a\\ud800b"')
    assert status == 400 and body["error"]["param"] == "messages.0.content", body
    assert "surrogate" in body["error"]["message"]
    status, body = raw_chat(server, '"a \\ud83d\\ude00 pair is fine"')
    assert status == 200, body


def test_a_lone_surrogate_or_a_huge_title_in_a_session_save_is_400(server):
    messages = '[{"role": "user", "content": "hi"}]'
    body = f'{{"messages": {messages}, "title": "a\\udc00b"}}'.encode()
    status, _, reply = http("POST", f"{server.url}/v1/sessions/bad/save", body)
    assert status == 400 and reply["error"]["param"] == "title", reply
    status, _, reply = http("POST", f"{server.url}/v1/sessions/bad/save",
                            {"messages": [{"role": "user", "content": "hi"}], "title": "t" * 2**20})
    assert status == 400 and reply["error"]["param"] == "title", reply
    assert "at most 200 characters" in reply["error"]["message"]
    assert not any(server.home.rglob("bad*")), "nothing was saved"


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_out_of_range_is_400(server, seed):
    status, _, body = http("POST", server.url + CHAT, {"model": MODEL, "seed": seed, "messages": [
        {"role": "user", "content": "hi"}]})
    assert status == 400 and "seed" in body["error"]["message"], body


def test_one_long_stop_string_is_taken(server):
    reply = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 12 + 7?"}], temperature=0, max_tokens=24,
        stop="a stop string longer than sixteen characters",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].message.content == server.reference, "a stop string that never comes changes nothing"


@pytest.mark.parametrize("stop, words", [
    (["s"] * 17, "at most 16 stop strings"),
    ("x" * 1001, "at most 1,000 characters"),
    (["ok", "y" * 1001], "at most 1,000 characters"),
    (["ok", ""], "empty"),
])
def test_too_many_or_too_long_stop_strings_are_400(server, stop, words):
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                stop=stop)
    assert caught.value.body["param"] == "stop" and words in caught.value.body["message"], caught.value.body


def rss_bytes(pid: int) -> int:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) * 1024


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_huge_prompt_is_refused_before_it_is_tokenized(server, endpoint):
    text = "the quick brown fox " * 195_000  # 3.9 MB: under the body limit, far over a 4,096-token context
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]} if endpoint == "chat" else \
        {"model": MODEL, "prompt": text}
    before = rss_bytes(server.process.pid)
    start = time.monotonic()
    status, _, reply = http("POST", f"{server.url}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}",
                            body)
    seconds = time.monotonic() - start
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    assert seconds < 1.5, f"refused in {seconds:.2f} s: tokenized first?"
    grown = rss_bytes(server.process.pid) - before
    assert grown < 100 * 2**20, f"the server grew by {grown / 2**20:.0f} MB"


# --- the API key


def test_the_bearer_scheme_is_case_insensitive(guarded):
    for scheme in ("bearer", "BEARER", "Bearer"):
        status, _, body = http("GET", f"{guarded.url}/v1/models", headers={"Authorization": f"{scheme} sesame"})
        assert status == 200, (scheme, body)


def test_a_401_says_bearer(guarded):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer "}):
        status, head, body = http("GET", f"{guarded.url}/v1/models", headers=headers)
        assert status == 401 and head.get("www-authenticate", head.get("WWW-Authenticate")) == "Bearer", head


# --- stalled requests


def stalled(server, head: str, body: bytes) -> tuple[bytes, float]:
    """Send ``head`` and ``body``, then nothing: what the server answers until it closes, and after how long."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head.encode() + body)
        start, answer = time.monotonic(), b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass  # still open after 30 s
        return answer, time.monotonic() - start


def post_head(path: str, length: int, key: str | None = "sesame") -> str:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n")


@pytest.mark.parametrize("key", ["sesame", None])
def test_a_stalled_body_is_408_then_closed(guarded, key):
    answer, seconds = stalled(guarded, post_head(CHAT, 100, key), b'{"model": ')
    assert seconds < BODY_TIMEOUT_S + 5, f"still open after {seconds:.1f} s"
    status = 408 if key else 401  # a refused request's body is drained under the same timeout
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    if key:
        assert b"did not arrive" in answer


@pytest.mark.parametrize("head", ["", "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"])
def test_a_request_head_that_never_ends_is_closed(guarded, head):
    answer, seconds = stalled(guarded, head, b"")
    assert answer == b"" and seconds < BODY_TIMEOUT_S + 5, f"{answer[:100]!r} after {seconds:.1f} s"


def test_a_slow_loris_head_is_closed_though_bytes_keep_coming(guarded):
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=30) as sock:
        start = time.monotonic()
        try:
            for byte in post_head(CHAT, 10):  # a byte every 0.2 s: each would reset an idle timer
                sock.sendall(byte.encode())
                time.sleep(0.2)
            closed = sock.recv(100) == b""
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        assert closed and time.monotonic() - start < BODY_TIMEOUT_S + 5


# --- options refused at start, before any model loads


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", str(free_port()), "--model",
                           "mini-target", "--no-draft", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, HF_HUB_OFFLINE="1"))


@pytest.mark.parametrize("args, words", [
    (("--api-key", ""), "--api-key must not be empty"),
    (("--api-key", "  "), "--api-key must not be empty"),
    (("--step-tokens", "1"), "--step-tokens (1) must be at least --max-running (8)"),
    (("--max-running", "100000"), "--max-running must be at most 1,024"),
    (("--max-waiting", "1000000"), "--max-waiting must be at most 100,000"),
])
def test_bad_serve_options_are_one_line_and_status_2(args, words):
    done = serve(*args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mlxchat:") and words in last, done.stderr
    assert "serving" not in done.stderr


# --- long stop strings: the reply's text is checked against each after every token


def longest_stop_start(text: str, stops: tuple[str, ...]) -> int:
    """The reference: the longest end of ``text`` that is a proper start of some stop string, by definition."""
    return max((n for stop in stops for n in range(1, len(stop)) if text.endswith(stop[:n])), default=0)


def test_the_text_held_back_for_stop_strings_is_the_longest_start_of_one():
    random = Random(7)
    for trial in range(3000):
        alphabet = "ab" if trial % 2 else "abc "
        stops = tuple("".join(random.choices(alphabet, k=random.randint(1, 10))) for _ in range(random.randint(0, 3)))
        choice, text = ChoiceState(0, split=False, stops=stops), ""
        for _ in range(random.randint(1, 8)):
            piece = "".join(random.choices(alphabet, k=random.randint(1, 4)))
            text += piece
            choice.feed(TokenEvent(token=0, text=piece, logprob=0.0))
            assert choice.content == text[:len(text) - longest_stop_start(text, stops)], (text, stops)


def test_sixteen_long_stop_strings_cost_little_per_token():
    stops = ("ab" * 500,) * 16  # the worst kind: many starts of each match the text's end in part
    choice = ChoiceState(0, split=False, stops=stops)
    start = time.perf_counter()
    for _ in range(200):
        choice.feed(TokenEvent(token=0, text="xab ", logprob=0.0))
    per_token = (time.perf_counter() - start) / 200
    assert per_token < 0.5e-3, f"{per_token * 1e3:.2f} ms per token"
