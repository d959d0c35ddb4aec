"""A prompt the whole KV budget cannot hold is refused (400) at once, never left waiting."""

from __future__ import annotations

import openai
import pytest

from serve_process import MODEL, ServeProcess

pytestmark = pytest.mark.slow


def test_a_prompt_over_the_whole_kv_budget_is_400(tmp_path):
    with ServeProcess(tmp_path, "--max-kv", "2MB") as server:  # about 550 tokens of target and draft KV
        client = server.client(timeout=5)
        long = [{"role": "user", "content": "the quick brown fox " * 300}]  # ~1,200 tokens: fits the context
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=long, max_tokens=5)
        assert caught.value.body["code"] == "context_length_exceeded"
