"""Streams keep a client alive while a long prompt is read: a client with a 10-second read timeout gets its reply
to a prompt that takes longer than that to read, on the chat, Responses and Messages APIs, each through its
official SDK (llama.cpp's --sse-ping-interval). The prompt's reading is slowed deterministically rather than
with a huge prompt: a real server whose steps that read prompt tokens each wait (tests/serve_slow_server.py),
with a small --step-tokens, so that reading it takes several such steps (see PROMPT_STEP_SECONDS)."""

from __future__ import annotations

import time

import pytest

from serve_process import MODEL, ServeProcess

pytestmark = pytest.mark.slow

READ_TIMEOUT = 10.0  # seconds without a byte before the client gives up (httpx's read timeout)
STEP_TOKENS = 8  # prompt tokens a step reads: each prompt below takes 6 steps or more
PROMPT_STEP_SECONDS = 2.2  # so reading a prompt takes 13 s or more, which the tests check from the client
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def question(api: str) -> str:
    """A prompt of its own per API (no prefix hit from the one before), of 30 tokens or more once templated."""
    return f"{api} asks: write one short sentence about the sea, the wind, the boats and the gulls above them."


@pytest.fixture(scope="module")
def slow_prompts(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve-pings"), "--max-running", "1", "--step-tokens",
                      str(STEP_TOKENS), pair=("--model", MODEL, "--no-draft"), script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_PROMPT_STEP_SECONDS": str(PROMPT_STEP_SECONDS)}) as server:
        yield server


class Watch:
    """When the stream began and when its first text came, as the client saw them."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.first: float | None = None

    def text(self, piece: str | None) -> None:
        if piece and self.first is None:
            self.first = time.monotonic()

    def assert_read_slowly(self) -> None:
        assert self.first is not None, "no text came"
        assert self.first - self.start > READ_TIMEOUT + 2, "the prompt was read within the timeout: no test"


def test_a_chat_stream_outlives_the_read_timeout(slow_prompts):
    client = slow_prompts.client(timeout=READ_TIMEOUT)
    watch, finish = Watch(), None
    for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question("chat")}],
                                                max_tokens=4, temperature=0, stream=True, extra_body=NO_THINKING):
        watch.text(chunk.choices[0].delta.content if chunk.choices else None)
        finish = chunk.choices[0].finish_reason if chunk.choices else finish
    assert finish in ("stop", "length")
    watch.assert_read_slowly()


def test_a_responses_stream_outlives_the_read_timeout(slow_prompts):
    client = slow_prompts.client(timeout=READ_TIMEOUT)
    watch, last = Watch(), None
    for event in client.responses.create(model=MODEL, input=question("responses"), max_output_tokens=4,
                                         temperature=0, reasoning={"effort": "none"}, stream=True):
        watch.text(getattr(event, "delta", None) if event.type == "response.output_text.delta" else None)
        last = event.type
    assert last in ("response.completed", "response.incomplete")
    watch.assert_read_slowly()


def test_a_messages_stream_outlives_the_read_timeout(slow_prompts):
    client = slow_prompts.anthropic(timeout=READ_TIMEOUT)
    watch, kinds = Watch(), []
    for event in client.messages.create(model=MODEL, max_tokens=4, stream=True,
                                        messages=[{"role": "user", "content": question("messages")}],
                                        thinking={"type": "disabled"}):
        kinds.append(event.type)
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            watch.text(event.delta.text)
    assert kinds[-1] == "message_stop"  # (the SDK skips the pings: Anthropic's own event, see test_serve_units)
    watch.assert_read_slowly()
