"""The Qwen3.5-9B twin (hybrid layers at Qwen3.5-9B's geometry, Qwen3's 151,936-token tokenizer, float32) where
users run it: ``ChatSession``, ``mlxchat ask``, ``mlxchat serve`` (the official openai client) and the chat
window (its engine in its own process), each on the default cache (the standard one, with a note).

ChatSession's greedy reply must be mlx-lm's ``stream_generate`` tokens for the prompt Qwen's template renders;
the other three, started as users start them, must say what ChatSession says (two turns where the place keeps
a chat).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from bench.twins import twin_folder
from mlxcore import GenerationParams, open_engine, render_chat
from sessions import ChatSession
from test_hybrid import assert_goes_on_as_the_live_one
from twin_fixtures import twins_root  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ("What is 12 + 7?", "And 3 + 4?")
PARAMS = {"temperature": 0.0, "max_tokens": 6}


@pytest.fixture(scope="module")
def twin(twins_root) -> Path:  # noqa: F811
    return twin_folder("qwen3.5-9b", bits=None, root=twins_root)


@pytest.fixture(scope="module")
def chat(twin) -> tuple[ChatSession, list[str]]:
    """ChatSession after two turns, thinking off; its first reply is checked against mlx-lm's tokens."""
    engine = open_engine(str(twin)).engine
    assert engine.kv.kind == "standard" and engine.batches
    session = ChatSession(engine, params=GenerationParams(**PARAMS), enable_thinking=False)
    said = [session.send(question) for question in QUESTIONS]
    model, tokenizer = load(str(twin))
    prompt = render_chat(tokenizer, [{"role": "user", "content": QUESTIONS[0]}], enable_thinking=False)
    expected = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=PARAMS["max_tokens"],
                                                 sampler=make_sampler(0.0))]
    first_turn = session.caches.tokens[len(prompt):len(prompt) + len(expected)]
    assert first_turn == expected and said[0] == tokenizer.decode(expected)
    return session, said


@pytest.fixture(scope="module")
def replies(chat) -> list[str]:
    return chat[1]


def test_chat_session_answers_as_mlx_lm(replies):
    assert all(replies)


def test_ask_answers_as_chat_session(twin, replies):
    done = subprocess.run([sys.executable, "-m", "app.cli", "ask", QUESTIONS[0], "--model", str(twin), "--temp", "0",
                           "--max-tokens", str(PARAMS["max_tokens"]), "--no-think", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["text"] == replies[0]
    assert "is a hybrid model (Qwen3.5)" in done.stderr


def test_serve_answers_as_chat_session(twin, replies, tmp_path):
    from serve_process import ServeProcess

    options = dict(model=twin.name, temperature=0, max_tokens=PARAMS["max_tokens"],
                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    history = [{"role": "user", "content": QUESTIONS[0]}]
    with ServeProcess(tmp_path, pair=("--model", str(twin))) as server:
        client = server.client()
        first = client.chat.completions.create(messages=history, **options).choices[0].message.content
        chunks = client.chat.completions.create(messages=history, stream=True, **options)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert first == streamed == replies[0]


def test_the_window_answers_as_chat_session(twin, chat):
    from app.engine_host.protocol import Open
    from test_tui_helpers import window_messages

    messages = window_messages(Open(model=str(twin), no_draft=True, params=PARAMS, think=False), QUESTIONS)
    assert messages == [(m.role, m.content) for m in chat[0].messages] and len(messages) == 4


def test_a_twin_chat_reuses_its_prefix_and_a_saved_one_goes_on_as_the_live_one(twin, tmp_path):
    """On the twin as on the tiny models (tests/test_hybrid.py): a chat saved with its linear states and
    reopened answers its next turn, a regenerate, an edit of the last message and a fork as the live chat
    does, each reading the same tokens and reusing a prefix."""
    engine = open_engine(str(twin)).engine
    live = ChatSession(engine, params=GenerationParams(**PARAMS), enable_thinking=False)
    for question in QUESTIONS:
        live.send(question)
    live.save(tmp_path / "chat.mlxchat")
    reopened = ChatSession.load(tmp_path / "chat.mlxchat", engine)
    assert reopened.caches.tokens == live.caches.tokens
    assert_goes_on_as_the_live_one(live, reopened)
