"""A speculative round's tokens reach a streaming client in one chunk, and the stream still says what the reply
says: through the official openai and anthropic clients, on a server whose replies draft 4 tokens every round
(``serve_fixed_draft.py``: the rounds happen whatever this host's timings)."""

from __future__ import annotations

import pytest

from serve_process import MODEL, ServeProcess

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("coalesced"), script="serve_fixed_draft.py",
                      env={"MLXCHAT_TEST_DRAFT_K": "4"}) as running:
        yield running


def test_a_rounds_tokens_go_out_in_one_openai_chunk_and_the_stream_is_the_reply(server):
    client = server.client()
    ask = dict(model=MODEL, messages=QUESTION, temperature=0, max_tokens=64,
               extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True, logprobs=True,
                                                 stream_options={"include_usage": True}))
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    assert "".join(choice.delta.content or "" for choice in choices) == whole.choices[0].message.content
    tokens = [len(choice.logprobs.content) for choice in choices if choice.logprobs]
    assert sum(tokens) == chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # each token once
    assert max(tokens) > 1, "a round's drafted tokens and its own came as one chunk"
    assert choices[-1].finish_reason == whole.choices[0].finish_reason


def test_a_rounds_tokens_go_out_in_one_anthropic_delta_and_the_stream_is_the_reply(server):
    client = server.anthropic()
    ask = dict(model=MODEL, max_tokens=64, messages=QUESTION, thinking={"type": "disabled"},
               extra_body={"temperature": 0})
    whole = client.messages.create(**ask)
    events = list(client.messages.create(**ask, stream=True))
    texts = [event.delta.text for event in events if event.type == "content_block_delta"]
    assert "".join(texts) == whole.content[0].text
    assert events[-2].delta.stop_reason == whole.stop_reason
    # the same reply's tokens, from the chat endpoint (not streamed): fewer text events than tokens with text
    same = server.client().chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=64,
                                                   logprobs=True,
                                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    text, entries = same.choices[0].message.content, same.choices[0].logprobs.content
    assert text == whole.content[0].text
    spelled = next(n for n in range(len(entries) + 1) if "".join(entry.token for entry in entries[:n]) == text)
    assert len(texts) < spelled  # (the tokens that spell the text; not the end of turn)
