"""`mlxchat serve` chat completions, through the official `openai` client against a real server process.

One server (embedded pair) for the module. The embedded target answers the
questions it was trained on, so the replies are checked against what they must
say, and against the same request made again (seeds, n, streaming vs not).
"""

from __future__ import annotations

import pytest

from serve_process import MODEL, ServeProcess

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-chat")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_answers_with_usage(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, extra_body=NO_THINK)
    choice = reply.choices[0]
    assert "19" in choice.message.content and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and reply.object == "chat.completion"
    assert reply.usage.prompt_tokens > 5 and reply.usage.completion_tokens > 3
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_gives_the_same_reply_and_usage_last(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, extra_body=NO_THINK)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=NO_THINK))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_reasoning_is_apart_from_the_answer_with_thinking_on(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    message = reply.choices[0].message
    assert "2 + 7 = 9" in message.reasoning_content and "<think>" not in message.reasoning_content
    assert "19" in message.content and "think>" not in message.content
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == (message.reasoning_content, message.content)
    last_reasoning = max(i for i, d in enumerate(deltas) if getattr(d, "reasoning_content", None))
    assert all(not d.content for d in deltas[:last_reasoning]), "reasoning deltas come before the answer"


def test_no_reasoning_with_thinking_off(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, extra_body=NO_THINK)
    message = reply.choices[0].message
    assert getattr(message, "reasoning_content", None) is None and "19" in message.content
    assert "think>" not in message.content


def test_n_choices_share_one_prompt(client, server):
    before = server.metrics()
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, n=3, temperature=1.0, seed=7,
                                           max_tokens=24, extra_body=NO_THINK)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content for c in reply.choices)
    assert 3 <= reply.usage.completion_tokens <= 3 * 24
    after = server.metrics()
    prompt = reply.usage.prompt_tokens
    computed = (after["mlxchat_prompt_tokens_total"] - before["mlxchat_prompt_tokens_total"]) - \
        (after["mlxchat_prefix_hit_tokens_total"] - before["mlxchat_prefix_hit_tokens_total"])
    assert computed <= prompt, f"the 3 choices computed {computed} prompt tokens; one prompt has {prompt}"
    streamed = client.chat.completions.create(model=MODEL, messages=QUESTION, n=3, temperature=1.0, seed=7,
                                              max_tokens=24, stream=True, extra_body=NO_THINK)
    texts = ["", "", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in reply.choices], "same seed, same three replies"


def test_a_seed_reproduces_a_sampled_reply(client):
    open_request = [{"role": "user", "content": "Tell me a story."}]  # many right answers: sampling shows

    def sample(seed: int) -> tuple[str, str]:
        message = client.chat.completions.create(model=MODEL, messages=open_request, temperature=1.5, seed=seed,
                                                 max_tokens=30).choices[0].message
        return message.reasoning_content, message.content

    first = sample(11)
    assert sample(11) == first
    assert any(sample(seed) != first for seed in (12, 13, 14)), "other seeds sample other replies"


def test_stop_strings_end_the_reply_before_them(client):
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, extra_body=NO_THINK)
    text = full.choices[0].message.content
    stop = "7 ="
    assert stop in text
    cut = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, stop=[stop, "never"],
                                         extra_body=NO_THINK)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[:text.index(stop)]


def test_max_tokens_cuts_with_length(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_completion_tokens=5)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 5


def test_ignore_eos_runs_the_reply_to_max_tokens(client):
    """vLLM's extension, for load tests: the same question ends early on its own, and runs to the cap with it."""
    ended = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=60,
                                           extra_body=NO_THINK)
    forced = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=60,
                                            extra_body={**NO_THINK, "ignore_eos": True})
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens < 60
    assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == 60
    assert forced.choices[0].message.content.startswith(ended.choices[0].message.content)


def test_logprobs_per_token(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, logprobs=True,
                                           top_logprobs=3, max_tokens=8, extra_body=NO_THINK)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 8
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    assert all(e.logprob <= 0 for e in entries)
    for entry in entries:
        tops = entry.top_logprobs
        assert len(tops) == 3 and tops[0].token == entry.token, "greedy picks the likeliest"
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert abs(tops[0].logprob - entry.logprob) < 1e-4


def test_second_turn_reports_cached_prompt_tokens(client):
    messages = [{"role": "system", "content": "You answer briefly."}, *QUESTION]
    first = client.chat.completions.create(model=MODEL, messages=messages, extra_body=NO_THINK)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And 3 + 4?"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, extra_body=NO_THINK)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert "7" in second.choices[0].message.content
    block = 16  # prefix hits are whole KV blocks
    assert cached >= block * (first.usage.prompt_tokens // block), f"cached {cached} of {second.usage.prompt_tokens}"
    assert cached < second.usage.prompt_tokens


def test_metrics_show_the_scheduler_and_the_latencies(client, server):
    client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, extra_body=NO_THINK)
    metrics = server.metrics()
    for name in ("mlxchat_queue_length", "mlxchat_running_requests", "mlxchat_tokens_per_second",
                 "mlxchat_prefix_hit_rate", "mlxchat_kv_bytes", "mlxchat_preemptions_total",
                 "mlxchat_pool_used_blocks", "mlxchat_engine_alive"):
        assert name in metrics, name
    assert metrics["mlxchat_requests_finished_total"] >= 1 and metrics["mlxchat_generated_tokens_total"] >= 8
    assert metrics["mlxchat_time_to_first_token_seconds_count"] >= 1
    assert metrics["mlxchat_inter_token_seconds_count"] >= 7
    assert metrics['mlxchat_http_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert metrics["mlxchat_kv_bytes"] > 0 and metrics["mlxchat_engine_alive"] == 1
