"""Sessions over HTTP: save a conversation into the session store, restore it in another server process, and
the next request on it computes only what is new (like llama.cpp's slot save/restore test).
"""

from __future__ import annotations

import pytest

from serve_process import MODEL, ServeProcess, http
from sessions.store import SessionStore

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
SYSTEM = {"role": "system", "content": "You are a careful calculator. Show the steps, then the result."}

pytestmark = pytest.mark.slow


def test_save_then_restore_in_a_new_server_reuses_the_cache(tmp_path):
    with ServeProcess(tmp_path) as first:
        client = first.client()
        messages = [SYSTEM, {"role": "user", "content": "What is 347 + 589?"}]
        reply = client.chat.completions.create(model=MODEL, messages=messages, extra_body=NO_THINK)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        status, _, saved = http("POST", f"{first.url}/v1/sessions/sums/save",
                                {"messages": messages, **NO_THINK})
        assert status == 200, saved
        assert saved["name"] == "sums" and saved["cached_tokens"] > reply.usage.prompt_tokens
    stored = SessionStore(first.home / "sessions")
    assert [m.role for m in stored.read("sums").history] == ["user", "assistant"], "in the store, as chats are"
    stored.close()

    follow_up = {"role": "user", "content": "And 12 + 7?"}
    with ServeProcess(tmp_path, home=first.home) as second:
        status, _, restored = http("POST", f"{second.url}/v1/sessions/sums/restore")
        assert status == 200, restored
        assert restored["messages"] == messages and restored["enable_thinking"] is False
        assert restored["cached_tokens"] == saved["cached_tokens"]
        again = second.client().chat.completions.create(model=MODEL, messages=restored["messages"] + [follow_up],
                                                        extra_body=NO_THINK)
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached >= 16 * (saved["cached_tokens"] // 16), f"{cached} of {again.usage.prompt_tokens} cached"
        assert "19" in again.choices[0].message.content

    # the control: the same request on a server that restored nothing
    with ServeProcess(tmp_path, home=tmp_path / "cold") as cold:
        control = cold.client().chat.completions.create(model=MODEL, messages=messages + [follow_up],
                                                        extra_body=NO_THINK)
        assert control.usage.prompt_tokens_details.cached_tokens == 0
        assert control.choices[0].message.content == again.choices[0].message.content


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-sessions")) as server:
        yield server


@pytest.mark.parametrize("name", ["..", "a.b", "-x", "x" * 65, "%2E%2E%2Fescape"])
def test_a_session_name_is_a_plain_identifier(server, name):
    status, _, body = http("POST", f"{server.url}/v1/sessions/{name}/save",
                           {"messages": [{"role": "user", "content": "hi"}]})
    assert status in (400, 404), body
    if status == 400:
        assert "is not a session name" in body["error"]["message"]
    assert not any(server.home.rglob("escape*")), "nothing written outside the store"


def test_restoring_a_missing_session_is_404(server):
    status, _, body = http("POST", f"{server.url}/v1/sessions/nothing_here/restore")
    assert status == 404 and "There is no session 'nothing_here'" in body["error"]["message"]


def test_save_checks_its_body(server):
    status, _, body = http("POST", f"{server.url}/v1/sessions/ok/save", {"messages": []})
    assert status == 400 and "messages" in body["error"]["message"]
