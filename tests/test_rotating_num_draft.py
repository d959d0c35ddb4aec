"""--num-draft K with the rotating window: rounds of K drafts still rewind after the window wrapped.

References: plain greedy decoding (the Engine without a draft, and `mlxchat ask --no-draft`) and
a cold session holding the same history.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlxcore  # noqa: F401
import numpy as np
import pytest

from app.cli import build_parser
from app.tui.run import open_command
from bench.draft_lengths import FixedDraftLength
from mlxcore.engine import Engine, KVConfig
from mlxcore.errors import UsageError
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from tiny_models import tiny_qwen3

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 48  # the session tests' window


def greedy(engine, prompt, n):
    events = engine.generate(prompt, engine.new_caches(), GenerationParams(max_tokens=n))
    return [e.token for e in events if isinstance(e, TokenEvent)]


def test_rounds_of_20_drafts_after_the_wrap_equal_plain_greedy():
    """Before: the window kept 16 spare slots whatever K was, and K >= 18 raised TrimError once it wrapped."""
    target, draft = tiny_qwen3(seed=3, vocab_size=512), tiny_qwen3(seed=5, vocab_size=512, layers=1)
    kv = KVConfig(kind="rotating", max_kv=24)
    prompt = np.random.default_rng(1).integers(0, 512, 40).tolist()  # longer than the window: wrapped at once
    spec = Engine(target, None, kv=kv, draft_model=draft, num_draft=20)
    spec.draft_control = FixedDraftLength(20)  # every round drafts 20...
    assert greedy(spec, prompt, 30) == greedy(Engine(target, None, kv=kv), prompt, 30)
    assert spec.last_stats.draft_accepted < spec.last_stats.draft_proposed / 2  # ...and rewinds most of them


def mlxchat_ask_both(*runs):
    """Token ids and final stats of `mlxchat ask --json` for each argument list, run side by side."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    processes = [subprocess.Popen([sys.executable, "-m", "app.cli", "ask", "--json", *args], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args in runs]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        records = [json.loads(line) for line in out.splitlines()]
        results.append(([r["token"] for r in records[:-1]], records[-1]["stats"]))
    return results


def test_ask_num_draft_20_on_a_wrapped_window_equals_no_draft():
    # A prompt longer than the window and its spare slots (64 + 20): every round runs after the wrap.
    prompt = ("My town is Lyon. My name is Ada. My number is 42. My pet is a cat called Tom. My friend is Bob "
              "and he lives in Paris. My car is red. Count the letter r in strawberry, then reverse the word "
              "strawberry, then tell me what is 47 times 8.")
    common = ["--model", "mini-target", "--kv", "rotating", "--max-kv", "64", "--max-tokens", "200", prompt]
    (plain, _), (spec, stats) = mlxchat_ask_both(["--no-draft", *common],
                                                 ["--draft", "mini-draft", "--num-draft", "20", *common])
    assert spec == plain
    assert stats["prompt_tokens"] > 64 + 20 and len(spec) > 20
    # How many rounds reject drafts (and rewind) follows measured timings, so it is not asserted here;
    # test_rounds_of_20_drafts_after_the_wrap_equal_plain_greedy rewinds 20 in every round.


@pytest.fixture(scope="module")
def pair():
    return load_model("mini-target"), load_model("mini-draft")


def rotating_engine(pair, num_draft):
    target, draft = pair
    return Engine(target.model, target.tokenizer, kv=KVConfig(kind="rotating", max_kv=WINDOW),
                  draft_model=draft.model, num_draft=num_draft, fingerprint=target.fingerprint,
                  draft_fingerprint=draft.fingerprint)


QUESTION = "My name is Ada and my town is Lyon. What is 47 times 8? Then reverse the word strawberry."


def test_file_saved_with_less_rewind_room_is_rebuilt(pair, tmp_path):
    saved = ChatSession(rotating_engine(pair, 4), enable_thinking=False)
    saved.send(QUESTION)
    assert saved.caches.target.offset > WINDOW + 4  # wrapped
    saved.save(tmp_path / "chat.mlxchat")

    same = ChatSession.load(tmp_path / "chat.mlxchat", rotating_engine(pair, 4))
    assert same.restore_note is None and same.caches.target.offset == saved.caches.target.offset

    engine = rotating_engine(pair, 20)
    engine.draft_control = FixedDraftLength(20)
    opened = ChatSession.load(tmp_path / "chat.mlxchat", engine)
    assert "num_draft=20" in opened.restore_note and "rebuilt" in opened.restore_note
    cold = ChatSession(rotating_engine(pair, 20), enable_thinking=False)
    cold.messages = list(opened.messages)
    assert opened.send("What is my name?") == cold.send("What is my name?")
    assert opened.last_stats.reused_tokens == 0
    assert opened.caches.target.window.max_rewind == opened.caches.draft.window.max_rewind == 20


def test_tui_open_command_carries_num_draft():
    args = build_parser().parse_args(["--num-draft", "20"])
    assert open_command(args).num_draft == 20
    with pytest.raises(UsageError, match="num_draft must be at least 1"):
        open_command(build_parser().parse_args(["--num-draft", "0"]))


def test_tui_with_bad_num_draft_is_one_line_before_it_starts():
    result = subprocess.run([sys.executable, "-m", "app.cli", "--num-draft", "0"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "mlxchat: --num-draft must be at least 1, not 0"


def test_tui_engine_host_opens_with_num_draft(tmp_path, monkeypatch):
    from app.engine_host import protocol as p
    from app.engine_host.server import EngineServer
    from engine_host_helpers import RecordingChannel

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    channel = RecordingChannel()
    server = EngineServer(channel)
    server.handle(p.Open(model="mini-target", draft="mini-draft", kv="rotating", max_kv=64, num_draft=20))
    assert not [e for e in channel.sent if isinstance(e, p.Failure)], channel.sent
    assert server.model.engine.draft_control.max_k == 20
    assert server.chats.screen.session.caches.target.window.max_rewind == 20
