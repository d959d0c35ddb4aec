"""Idle unload on a real `mlxchat serve`: after --idle-unload seconds without requests (or a request's
keep_alive) the model's weights and KV pool go, the process's resident memory drops, /health and /metrics
say nothing is loaded, and the next request loads it again (the log says so) and answers the same greedy
tokens."""

from __future__ import annotations

import openai
import pytest

from serve_process import MODEL, ServeProcess, http, poll_until
from twin_fixtures import twin_06b_f32, twins_root  # noqa: F401

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]
MIN_DROP_BYTES = 250 * 10**6  # the 0.6B twin's first KV slab alone is ~940 MB, its float32 weights ~95 MB


def greedy(server: ServeProcess, model: str, **extra) -> tuple[str, int]:
    reply = server.client().chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=8,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}} | extra)
    return reply.choices[0].message.content, reply.usage.completion_tokens


def loaded(server: ServeProcess) -> list[str]:
    return http("GET", f"{server.url}/health")[2]["models_loaded"]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmRSS:"))
    return int(kb) * 1024


def test_an_idle_model_is_unloaded_its_memory_drops_and_it_answers_the_same_after(tmp_path, twin_06b_f32):
    name = twin_06b_f32.name
    with ServeProcess(tmp_path, "--idle-unload", "2", pair=("--model", str(twin_06b_f32), "--no-draft")) as server:
        first = greedy(server, name)
        busy = rss_bytes(server.process.pid)  # at once: it stays loaded 2 s after its last request
        unloads = server.log().count(f"unloaded {name}")
        poll_until(lambda: server.log().count(f"unloaded {name}") > unloads, every=0.1)  # logged once freed
        idle = rss_bytes(server.process.pid)
        assert loaded(server) == []
        assert busy - idle >= MIN_DROP_BYTES, f"resident memory {busy / 1e6:.0f} MB loaded, {idle / 1e6:.0f} MB idle"
        metrics = server.metrics()
        assert metrics["mlxchat_kv_bytes"] == 0 and not any(k.startswith("mlxchat_model_loaded") for k in metrics)
        assert greedy(server, name) == first
        assert loaded(server) == [name] and server.metrics()[f'mlxchat_model_loaded{{model="{name}"}}'] == 1
    assert f"loading {name} again" in server.log()


def test_keep_alive_0_unloads_after_the_reply_and_a_bad_one_is_a_400(tmp_path):
    with ServeProcess(tmp_path, pair=("--model", MODEL, "--no-draft")) as server:
        reference = greedy(server, MODEL)
        assert greedy(server, MODEL, keep_alive=0) == reference
        poll_until(lambda: loaded(server) == [], every=0.05)
        assert greedy(server, MODEL, keep_alive="5m") == reference and loaded(server) == [MODEL]
        with pytest.raises(openai.BadRequestError) as caught:
            greedy(server, MODEL, keep_alive="five minutes")
        assert "not a duration" in caught.value.body["message"]
    assert f"unloaded {MODEL} after 0 s without requests" in server.log()


def test_keep_alive_on_the_messages_and_responses_apis(tmp_path):
    """Anthropic's and OpenAI's Responses requests take the chat endpoint's keep_alive too (an extension)."""
    with ServeProcess(tmp_path, pair=("--model", MODEL, "--no-draft")) as server:
        server.anthropic().messages.create(model=MODEL, max_tokens=4, messages=QUESTION, extra_body={"keep_alive": 0})
        poll_until(lambda: loaded(server) == [], every=0.05)
        server.client().responses.create(model=MODEL, input="What is 12 + 7?", max_output_tokens=4,
                                         extra_body={"keep_alive": "5m"})
        assert loaded(server) == [MODEL]
        server.client().responses.create(model=MODEL, input="What is 12 + 7?", max_output_tokens=4,
                                         extra_body={"keep_alive": 0})
        poll_until(lambda: loaded(server) == [], every=0.05)
        status, _, body = http("POST", f"{server.url}/v1/messages", {"model": MODEL, "max_tokens": 4,
                                                                    "messages": QUESTION, "keep_alive": "soon"})
        assert status == 400 and "not a duration" in body["error"]["message"], body


def test_a_saved_chat_comes_back_from_the_store_after_an_unload(tmp_path):
    """The chats saved (or restored) before an idle unload are restored from the store as the model loads
    again: the next request on one reads only its new tokens, as it would have before the unload."""
    no_think = {"chat_template_kwargs": {"enable_thinking": False}}
    messages = [{"role": "system", "content": "You are a careful calculator. Show the steps, then the result."},
                {"role": "user", "content": "What is 347 + 589?"}]
    with ServeProcess(tmp_path, "--idle-unload", "1") as server:
        reply = server.client().chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                        max_tokens=40, extra_body=no_think)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        status, _, saved = http("POST", f"{server.url}/v1/sessions/sums/save", {"messages": messages, **no_think})
        assert status == 200, saved
        poll_until(lambda: loaded(server) == [], every=0.1)
        follow_up = messages + [{"role": "user", "content": "And 12 + 7?"}]
        again = server.client().chat.completions.create(model=MODEL, messages=follow_up, temperature=0,
                                                        max_tokens=8, extra_body=no_think)
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached >= 16 * (saved["cached_tokens"] // 16), f"{cached} of {again.usage.prompt_tokens} cached"
    assert f"restored 1 saved chats of {MODEL} from the store ({saved['cached_tokens']} tokens of KV)" in server.log()
