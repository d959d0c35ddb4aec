"""The `mlxchat` command as a user runs it: answers, --json, and one-line errors with exit status 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mlxchat(*args, stdin=None, env=None):
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, input=stdin, env=full_env,
                          capture_output=True, text=True, timeout=300)


def test_ask_answers_offline_with_the_embedded_models():
    result = mlxchat("ask", "What is 12 + 7?")
    assert result.returncode == 0, result.stderr
    assert "19" in result.stdout
    assert "embedded" in result.stderr  # the user is told why the demo models answer


def test_ask_json_gives_events_then_stats():
    result = mlxchat("ask", "--json", "--no-think", "--max-tokens", "40", "Reverse the word stone.")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(r["type"] == "token" for r in records[:-1]) and records[-1]["type"] == "final"
    assert "".join(r["text"] for r in records[:-1]) == records[-1]["text"]
    assert records[-1]["stats"]["generated_tokens"] == len(records) - 1


def test_prompt_from_stdin():
    result = mlxchat("ask", "--no-think", "-", stdin="What is 12 + 7?\n")
    assert result.returncode == 0, result.stderr
    assert "19" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["ask", ""], "empty"),
    (["ask", "--model", "no-such-model", "hi"], "no-such-model"),
    (["ask", "--model", "/nonexistent/folder", "hi"], "folder"),
    (["ask", "--temp", "-1", "hi"], "temperature"),
    (["ask", "--top-p", "0", "hi"], "top_p"),
    (["ask", "--num-draft", "0", "hi"], "num-draft"),
    (["bench", "--only", "nonsense"], "nonsense"),
    (["bench", "--only", "paged_kv_overhead,nonsense"], "nonsense"),
])
def test_user_mistakes_give_one_line_and_status_2(args, message):
    result = mlxchat(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert message in result.stderr.lower() or message in result.stderr


def test_corrupt_model_folder_is_a_clear_error(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    result = mlxchat("ask", "--model", str(folder), "hi")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "config" in result.stderr.lower()


def test_too_long_prompt_is_a_clear_error():
    result = mlxchat("ask", "--no-draft", "-", stdin="word " * 50_000)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "context" in result.stderr


def test_help_explains_the_commands():
    result = mlxchat("--help")
    assert result.returncode == 0
    for word in ("ask", "bench", "--model", "--kv", "--think"):
        assert word in result.stdout
