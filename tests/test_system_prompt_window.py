"""A system prompt longer than the rotating window is a usage error that says what to do, everywhere."""

import os
import subprocess
import sys
from pathlib import Path

import mlxcore  # noqa: F401
import pytest

from mlxcore.engine import Engine, KVConfig
from mlxcore.errors import PromptError
from mlxcore.loading import load_model
from sessions.chat_session import ChatSession

ROOT = Path(__file__).resolve().parent.parent
LONG_SYSTEM = "You are Ada, a careful assistant who answers in full sentences and checks every step. " * 3
WHAT_TO_DO = "use a bigger --max-kv, or a shorter system prompt"  # as the command line and the window say it
IN_THE_API = "use a bigger max_kv, or a shorter system prompt"  # as ChatSession raises it


@pytest.fixture(scope="module")
def engine():
    target = load_model("mini-target")
    return Engine(target.model, target.tokenizer, kv=KVConfig(kind="rotating", max_kv=32))


def test_session_refuses_with_what_to_do(engine):
    session = ChatSession(engine, system=LONG_SYSTEM, enable_thinking=False)
    with pytest.raises(PromptError, match=r"The system prompt has \d+ tokens and does not fit in the rotating "
                                          r"KV window of 32: " + IN_THE_API):
        session.send("What is 12 + 7?")
    session.set_system("You are Ada.")  # the fix the message suggests: the chat goes on
    assert session.send("What is 12 + 7?")


def test_ask_prints_one_line_with_status_2():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--model", "mini-target", "--no-draft",
                             "--kv", "rotating", "--max-kv", "32", "--system", LONG_SYSTEM, "What is 12 + 7?"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("mlxchat: The system prompt has ") and WHAT_TO_DO in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_tui_engine_host_shows_it_as_a_dialog_not_a_crash(tmp_path, monkeypatch):
    from app.engine_host import protocol as p
    from app.engine_host.server import EngineServer
    from engine_host_helpers import RecordingChannel

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    channel = RecordingChannel()
    server = EngineServer(channel)
    server.handle(p.Open(model="mini-target", no_draft=True, kv="rotating", max_kv=32, system=LONG_SYSTEM,
                         think=False))
    server.handle(p.Send("What is 12 + 7?"))
    failures = [e for e in channel.sent if isinstance(e, p.Failure)]
    assert len(failures) == 1 and failures[0].code is p.FailureCode.SYSTEM_PROMPT_TOO_LONG
    assert WHAT_TO_DO in failures[0].message
