"""Every user path on the twins of the users' pair (Qwen3's real tokenizer and template, 151,936 tokens,
the real KV geometry): `mlxchat ask` plain and speculative, `ask --session` over three processes, turns with
think blocks, regenerate, fork, save and load, the chat window, a draft with a padded vocabulary.

4-bit twins run where the 4-bit layout itself matters (a few tokens: 4-bit matmuls are slow on this CPU);
float32 twins elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mlxcore.chat_template import render_chat
from mlxcore.configs import ModelChoice
from bench.draft_lengths import FixedDraftLength
from mlxcore.launch import open_engine
from mlxcore.params import GenerationParams
from mlxcore.sequences import common_prefix_length
from mlxcore.think_blocks import EMPTY
from process_watch import HANG_S
from sessions.chat_session import ChatSession
from sessions.file_format import read_header
from sessions.file_header import read_saved_session
from sessions.messages import Message
from turn_checks import send_matching_a_cold_run
from twin_fixtures import twin_06b, twin_06b_f32, twin_06b_f32_padded, twin_8b, twin_8b_f32, twins_root  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
GREEDY = GenerationParams(temperature=0.0, max_tokens=12)
pytestmark = pytest.mark.slow


def ask_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", "ask", "--json", *args]


def run_together(*commands: list[str]) -> list[list[dict]]:
    """Run the commands at once (2 cores), each to its end; their JSON lines. Their home (sessions, the KV disk
    tier) is a fresh folder: a prompt finds no blocks an earlier test or run left on disk."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLXCHAT_HOME=tempfile.mkdtemp(prefix="mlxchat-home-"))
    runs = [subprocess.Popen(c, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for c in commands]
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=HANG_S)
        assert run.returncode == 0, err
        outputs.append([json.loads(line) for line in out.splitlines()])
    return outputs


def tokens(records: list[dict]) -> list[int]:
    return [r["token"] for r in records if r["type"] == "token"]


def test_ask_speculative_greedy_equals_plain_on_the_4bit_pair(twin_8b, twin_06b):  # noqa: F811
    common = ["--model", str(twin_8b), "--temp", "0", "--max-tokens", "10", "--no-think", "Hello, who are you?"]
    plain, speculative = run_together(ask_command(*common, "--no-draft"), ask_command(*common, "--draft", str(twin_06b)))
    assert tokens(speculative) == tokens(plain) and len(tokens(plain)) == 10
    assert speculative[-1]["stats"]["draft_proposed"] > 0, "the draft was used"


def test_ask_samples_with_the_models_recommended_settings(twin_8b_f32):  # noqa: F811
    """No option: generation_config.json's temperature 0.6, top-p 0.95, top-k 20; --temp 0 is greedy."""
    base = ["--model", str(twin_8b_f32), "--no-draft", "--max-tokens", "16", "--no-think", "Tell me a story."]
    sampled = run_together(ask_command(*base), ask_command(*base))
    greedy = run_together(ask_command(*base, "--temp", "0"), ask_command(*base, "--temp", "0"))
    assert tokens(sampled[0]) != tokens(sampled[1]), "two runs without a seed sample differently"
    assert tokens(greedy[0]) == tokens(greedy[1])


def test_ask_session_over_three_processes_prefills_only_what_is_new(tmp_path, twin_8b_f32):  # noqa: F811
    path = tmp_path / "chat.mlxchat"
    held = 0
    for number, question in enumerate(("What is a cat?", "And a dog?", "And a bird?"), 1):
        [records] = run_together(ask_command("--session", str(path), "--model", str(twin_8b_f32), "--no-draft",
                                             "--temp", "0", "--max-tokens", "24", "--no-think", question))
        stats = records[-1]["stats"]
        assert stats["reused_tokens"] == held, f"turn {number} reuses everything the cache held"
        saved = read_saved_session(read_header(path), str(path))
        held = len(saved.target.tokens)
        assert held == stats["prompt_tokens"] + stats["generated_tokens"]
    assert [m.role for m in saved.history] == ["user", "assistant"] * 3
    assert all(m.content.startswith(EMPTY) for m in saved.history[1::2]), "replies keep the block they follow"


@pytest.fixture(scope="module")
def pair(twin_8b_f32, twin_06b_f32):  # noqa: F811
    engine = open_engine(ModelChoice(model=str(twin_8b_f32), draft=str(twin_06b_f32))).engine
    engine.draft_control = FixedDraftLength(4)  # the same rounds in every run
    return engine


def test_turns_with_think_blocks_render_as_qwen3_does_and_prefill_only_the_tail(pair):
    session = ChatSession(pair, "Be brief.", GREEDY, enable_thinking=True)
    session.messages += [Message("user", "What is 2 + 2?"),
                         Message("assistant", "<think>\nTwo and two.\n</think>\n\nFour."),
                         Message("user", "And 3 + 3?"), Message("assistant", EMPTY + "Six.")]
    for thinking in (True, False):
        session.enable_thinking = thinking
        held = list(session.caches.tokens)
        send_matching_a_cold_run(session, f"Thinking {'on' if thinking else 'off'}: and 4 + 4?")
        stats, messages = session.last_stats, [m.as_dict() for m in session.messages[:-1]]
        reference = list(pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                            enable_thinking=thinking))
        prompt = render_chat(pair.tokenizer, messages, enable_thinking=thinking)
        if thinking:
            assert prompt == reference, "with thinking on, history renders exactly as Qwen3's template does"
        else:
            assert common_prefix_length(prompt, reference) < len(reference) and len(prompt) > len(reference), \
                "with thinking off, the earlier empty block is kept: the template alone would drop it"
        assert stats.prefill_tokens == stats.prompt_tokens - common_prefix_length(held, prompt)


def test_regenerate_fork_save_and_load(pair, tmp_path):
    session = ChatSession(pair, params=GREEDY, enable_thinking=False)
    first = send_matching_a_cold_run(session, "Name a colour.")
    assert session.regenerate() == first and session.last_stats.reused_tokens > 0
    twin = session.fork()
    send_matching_a_cold_run(twin, "Another one?")
    session.save(tmp_path / "chat.mlxchat")
    loaded = ChatSession.load(tmp_path / "chat.mlxchat", pair)
    assert loaded.history == session.history and loaded.restore_note is None
    send_matching_a_cold_run(loaded, "And a third?")
    assert loaded.last_stats.reused_tokens == len(session.caches.tokens)


def test_a_draft_with_a_padded_vocabulary(twin_8b_f32, twin_06b_f32_padded):  # noqa: F811
    engine = open_engine(ModelChoice(model=str(twin_8b_f32), draft=str(twin_06b_f32_padded))).engine
    engine.draft_control = FixedDraftLength(4)
    session = ChatSession(engine, params=GREEDY, enable_thinking=False)
    send_matching_a_cold_run(session, "Hello?")
    assert session.last_stats.draft_proposed > 0


def test_the_chat_window_opens_a_twin_and_answers(twin_8b_f32, monkeypatch, tmp_path):  # noqa: F811
    from test_tui_helpers import SIZE, make_app, send, wait_ready
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))

    async def scenario():
        app = make_app(model=str(twin_8b_f32), draft=None, no_draft=True, max_tokens=8)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await send(pilot, app, "Hello?")
            return app.state.messages, app.status.stats
    messages, stats = asyncio.run(scenario())
    assert messages[0] == ("user", "Hello?") and messages[1][0] == "assistant" and messages[1][1]
    assert stats["generated_tokens"] == 8


def test_replies_drafting_side_by_side_equal_each_alone_on_the_twins(pair):
    """Two replies on the 8B twin, each drafted by the 0.6B twin as rows of one batch (``spec_rows.py``): each
    as the same request alone without the draft."""
    from mlxcore.batching.local import LocalBatch, drain
    from mlxcore.batching.request import Request
    from mlxcore.events import FinalEvent, TokenEvent

    prompts = [tuple(pair.tokenizer.encode(text)) for text in ("Name a colour.", "Count to three, slowly, please.")]

    def replies(requests):
        batch = LocalBatch(pair)
        handles = [batch.submit(r)[0] for r in requests]
        events = {h.request_id: [] for h in handles}
        while batch.busy:
            batch.step()
            for h in handles:
                events[h.request_id].extend(drain(h))
        return [events[h.request_id] for h in handles], batch.runner.tally.largest_batch

    together, largest = replies([Request(p, GREEDY) for p in prompts])
    assert largest == 2
    for p, events in zip(prompts, together):
        final = events[-1]
        assert isinstance(final, FinalEvent) and final.stats.draft_proposed > 0
        reference = replies([Request(p, GREEDY, use_draft=False)])[0][0]
        assert [e.token for e in events if isinstance(e, TokenEvent)] == \
            [e.token for e in reference if isinstance(e, TokenEvent)]
