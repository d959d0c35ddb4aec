"""The KV disk tier on a real `mlxchat serve` (issue 61): a long conversation's blocks survive a restart.

A ~3,000-token conversation on the embedded pair; the server stops (SIGTERM, as a user stops it) and a new one
starts on the same home: the next turn reads back from disk all but its new tokens and at most one block, and
its greedy tokens equal those of a cold server (``--disk-kv 0``), for float and 8-bit KV. ``/metrics`` counts
the disk's hits apart.
"""

from __future__ import annotations

import pytest

from serve_process import MODEL, ServeProcess, http, poll_until

BLOCK = 16
RULES = " ".join(f"Rule {i}: keep the answer short and polite." for i in range(120))
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def conversation() -> list[dict]:
    """A system prompt and three turns: about 3,000 tokens of the embedded pair's tokenizer."""
    messages = [{"role": "system", "content": RULES}]
    for turn in range(3):
        messages.append({"role": "user", "content": " ".join(f"Question {turn}.{i} about the rules?"
                                                             for i in range(25))})
        messages.append({"role": "assistant", "content": f"Answer {turn}: yes, all of them."})
    return messages


def ask(server: ServeProcess, messages: list[dict]):
    reply = server.client().chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8,
                                                    extra_body=NO_THINKING)
    return reply.choices[0].message.content, reply.usage


@pytest.mark.parametrize("kv_bits", [(), ("--kv-bits", "8")], ids=["float", "8-bit"])
def test_a_restarted_server_reads_the_conversation_back_from_disk(tmp_path, kv_bits):
    first = conversation() + [{"role": "user", "content": "Which rule comes first?"}]
    with ServeProcess(tmp_path, *kv_bits) as server:
        answer, usage = ask(server, first)
    before = usage.prompt_tokens
    assert before > 2800, before  # a conversation of about 3,000 tokens

    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the last?"}]
    with ServeProcess(tmp_path, *kv_bits) as server:  # the same home: the same disk tier
        warm, usage = ask(server, second)
        disk_hits = server.metrics()["mlxchat_prefix_disk_hit_tokens_total"]
    new_tokens = usage.prompt_tokens - before
    computed = usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
    assert computed <= new_tokens + BLOCK, (computed, new_tokens)
    assert disk_hits == usage.prompt_tokens_details.cached_tokens  # the new server's memory held none of it

    with ServeProcess(tmp_path, *kv_bits, "--disk-kv", "0", home=tmp_path / "cold") as server:
        cold, usage = ask(server, second)
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert server.metrics()["mlxchat_prefix_disk_hit_tokens_total"] == 0
    assert warm == cold


def test_after_an_idle_unload_the_next_turn_reads_the_conversation_back_from_disk(tmp_path):
    """--idle-unload: the ~3,000-token conversation's model is unloaded for being idle (its blocks to disk); the
    next turn reads back all but its new tokens and at most one block, its greedy tokens those of a cold server."""
    first = conversation() + [{"role": "user", "content": "Which rule comes first?"}]
    with ServeProcess(tmp_path, "--idle-unload", "1") as server:
        answer, usage = ask(server, first)
        before = usage.prompt_tokens
        poll_until(lambda: http("GET", f"{server.url}/health")[2]["models_loaded"] == [], every=0.1)
        second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the last?"}]
        warm, usage = ask(server, second)
        disk_hits = server.metrics()["mlxchat_prefix_disk_hit_tokens_total"]
    computed = usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
    assert computed <= usage.prompt_tokens - before + BLOCK, (computed, usage.prompt_tokens - before)
    assert disk_hits == usage.prompt_tokens_details.cached_tokens  # the model came back with nothing in memory

    with ServeProcess(tmp_path, "--disk-kv", "0", home=tmp_path / "cold") as server:
        cold, usage = ask(server, second)
        assert usage.prompt_tokens_details.cached_tokens == 0
    assert warm == cold


def test_two_models_alternating_under_max_models_1_read_their_blocks_back(tmp_path):
    """Two models by name under --max-models 1, alternating requests on two long conversations: each request
    unloads the other model (its blocks to disk); from the second round on each reads at most its new
    tokens plus one block. Then --idle-unload: the same after the model was unloaded for being idle."""
    from assets import MODELS_DIR

    models = tmp_path / "models"
    models.mkdir()
    (models / "mini-draft").symlink_to(MODELS_DIR / "mini-draft", target_is_directory=True)
    chats = {name: [{"role": "system", "content": f"{name}: {RULES[:3000]}"}] for name in (MODEL, "mini-draft")}
    before = dict.fromkeys(chats, 0)
    with ServeProcess(tmp_path, "--max-models", "1", "--models-dir", str(models), "--idle-unload", "3",
                      pair=("--model", MODEL, "--no-draft")) as server:
        for turn in range(3):
            for name, messages in chats.items():
                messages.append({"role": "user", "content": f"Question {turn} for {name}?"})
                reply = server.client().chat.completions.create(model=name, messages=messages, temperature=0,
                                                                max_tokens=8, extra_body=NO_THINKING)
                usage = reply.usage
                computed = usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
                if turn:
                    assert computed <= usage.prompt_tokens - before[name] + BLOCK, (name, turn, computed)
                before[name] = usage.prompt_tokens
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        poll_until(lambda: http("GET", f"{server.url}/health")[2]["models_loaded"] == [], every=0.1)
        messages = chats["mini-draft"] + [{"role": "user", "content": "One more?"}]
        reply = server.client().chat.completions.create(model="mini-draft", messages=messages, temperature=0,
                                                        max_tokens=8, extra_body=NO_THINKING)
        usage = reply.usage
        assert usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens <= \
            usage.prompt_tokens - before["mini-draft"] + BLOCK
