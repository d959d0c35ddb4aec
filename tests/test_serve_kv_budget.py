"""A prompt the whole KV budget cannot hold is refused (400) at once, never left waiting; /v1/models lists the
context the KV memory holds (what an agent reads to compact in time), not only the model's own."""

from __future__ import annotations

import openai
import pytest

from serve_process import MODEL, ServeProcess, http

pytestmark = pytest.mark.slow


def test_a_prompt_over_the_whole_kv_budget_is_400_and_the_models_list_says_what_fits(tmp_path):
    with ServeProcess(tmp_path, "--max-kv", "2MB") as server:  # about 550 tokens of target and draft KV
        status, _, listing = http("GET", f"{server.url}/v1/models")
        assert status == 200, listing
        entry = next(e for e in listing["data"] if e["id"] == MODEL)
        fits = entry["context_length"]
        assert 0 < fits < 1_000 and entry["max_context_length"] == 4096, entry  # the embedded target's own: 4096
        assert entry["max_model_len"] == entry["loaded_context_length"] == fits  # vLLM's and LM Studio's names
        client = server.client(timeout=5)
        long = [{"role": "user", "content": "the quick brown fox " * 300}]  # ~1,200 tokens: fits the context
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=long, max_tokens=5)
        assert caught.value.body["code"] == "context_length_exceeded"
        assert f"the {fits:,} tokens the server's KV memory holds" in caught.value.body["message"]
