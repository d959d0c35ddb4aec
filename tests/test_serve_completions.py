"""`POST /v1/completions` (the legacy endpoint: a raw prompt, no chat template) through the `openai` client."""

from __future__ import annotations

import openai
import pytest

from serve_process import MODEL, ROOT, ServeProcess

PROMPT = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-completions")) as server:
        yield server.client()


def test_a_text_prompt_is_completed_with_usage(client):
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and "19" in choice.text and choice.finish_reason == "stop"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    short = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0)  # OpenAI's default: 16 tokens
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 16
    assert choice.text.startswith(short.choices[0].text)


def test_token_ids_are_a_prompt_too(client):
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(ROOT / "assets" / "models" / "mini-target").encode(PROMPT,
                                                                                         add_special_tokens=False)
    by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.usage.prompt_tokens == len(ids) == by_text.usage.prompt_tokens
    assert by_ids.choices[0].text == by_text.choices[0].text
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=[1, 2, 10**7])
    assert "outside the vocabulary" in caught.value.body["message"]


def test_streaming_gives_the_same_text_and_usage_last(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_logprobs_with_alternatives(client):
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens) == reply.choices[0].text and len(logprobs.token_logprobs) == 6
    assert all(len(top) == 2 and max(top.values()) <= 0 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


@pytest.mark.parametrize("fields, words", [({"echo": True}, "echo is not supported"),
                                           ({"prompt": ["one", "two"]}, "one prompt per request"),
                                           ({"suffix": "x"}, "Unsupported field 'suffix'")])
def test_what_it_cannot_do_is_400(client, fields, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**{"model": MODEL, "prompt": PROMPT, **fields})
    assert words in caught.value.body["message"]
