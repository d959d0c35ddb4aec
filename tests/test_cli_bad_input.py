"""What a clumsy user or a hostile file feeds the CLI (issue 31): one line on stderr and status 2, never a traceback;
text from files printed without its control characters; a low open-file limit; a long chat's reply cap."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.file_append import rewrite_header
from sessions.file_format import encode_header, read_header
from sessions.file_header import read_saved_session
from test_cli import ROOT, mlxchat

PAIR = ["--model", "mini-target", "--draft", "mini-draft"]
CONTEXT = 4096  # mini-target's context
LONG = "The quick brown fox jumps over the lazy dog. " * 140  # ~2,950 tokens
# What a terminal would act on: C0 controls but newline and tab, DEL, C1 controls, bidi overrides and isolates.
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "\x1b]52;c;aGFja2Vk\x07\x1b[2J\u202eevil\x9b31m\x1b[0m"  # clipboard write, clear screen, bidi, C1 CSI


def ask(home: Path, *args: str | bytes, stdin: bytes | None = None, preexec=None) -> subprocess.CompletedProcess:
    """``mlxchat ask ARGS`` as a user runs it, stdin given as bytes; output decoded leniently."""
    done = subprocess.run([sys.executable, "-m", "app.cli", "ask", *args], cwd=ROOT, input=stdin,
                          capture_output=True, timeout=300, preexec_fn=preexec,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", MLXCHAT_HOME=str(home)))
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))


def assert_one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    """A user mistake: status 2 and one `mlxchat:` line (after the offline notice) that names the problem."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mlxchat:") and all(word in last for word in words), result.stderr


def test_latin1_on_stdin_is_refused_in_one_line(tmp_path):
    assert_one_line(ask(tmp_path, "--no-think", "-", stdin="Qu'est-ce qu'un café ?".encode("latin-1")), "UTF-8")


@pytest.mark.parametrize("args", [[b"caf\xe9 ?"], [b"--system", b"Sois br\xe8f.", b"hi"]])
def test_non_utf8_arguments_are_refused_in_one_line(tmp_path, args):
    assert_one_line(ask(tmp_path, "--no-think", *args), "UTF-8")


def test_a_negative_seed_is_refused_before_the_session_changes(tmp_path):
    path = tmp_path / "chat.mlxchat"
    assert_one_line(ask(tmp_path, "--session", str(path), "--seed", "-1", "hi"), "seed")
    assert_one_line(ask(tmp_path, "--seed", str(2**64), "hi"), "seed")
    assert not path.exists()


def test_serve_refuses_a_negative_seed_at_start():
    result = mlxchat("serve", "--seed", "-1", "--model", "mini-target")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "seed" in result.stderr, result.stderr


def stored_chat(home: Path, name: str, prompt: str) -> Path:
    """A chat file in the store's folder (an earlier version's kind: listed as it is), made by `ask`."""
    path = home / "sessions" / f"{name}.mlxchat"
    path.parent.mkdir(parents=True, exist_ok=True)
    assert ask(home, "--session", str(path), "--no-think", "--max-tokens", "2", *PAIR, prompt).returncode == 0
    return path


def set_model_name(path: Path, name: str) -> None:
    """Rewrite the file as another program could: the model's name (and so its fingerprint) changed."""
    header = read_header(path)
    header["model"] = {"name": name, "fingerprint": "0" * 16}
    rewrite_header(path, encode_header(header))


def test_text_from_files_reaches_the_terminal_without_control_characters(tmp_path):
    path = stored_chat(tmp_path, "evil", HOSTILE + " " + "x" * 500)
    set_model_name(path, "model" + HOSTILE)
    outputs = [mlxchat("sessions", "ls", env={"MLXCHAT_HOME": str(tmp_path)}),
               mlxchat("sessions", "show", "evil", env={"MLXCHAT_HOME": str(tmp_path)}),
               ask(tmp_path, "--session", str(path), "--no-think", "--max-tokens", "2", *PAIR, "hi")]
    for result in outputs:
        assert result.returncode == 0, result.stderr
        assert not TERMINAL_CONTROL.search(result.stdout + result.stderr), ascii(result.stdout + result.stderr)
    listed = outputs[0].stdout
    assert "^[]52;c;aGFja2Vk^G" in listed and "evil" in listed
    assert len(listed.splitlines()[0]) < 250, "a long title is cut for display"
    renamed = mlxchat("sessions", "rename", "evil", "new\x1b[31m title", env={"MLXCHAT_HOME": str(tmp_path)})
    assert renamed.returncode == 0 and not TERMINAL_CONTROL.search(renamed.stdout), ascii(renamed.stdout)


def low_open_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def test_a_low_open_file_limit_is_said_and_the_answer_comes(tmp_path):
    result = ask(tmp_path, "--no-think", "What is 12 + 7?", preexec=low_open_file_limit)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "19" in result.stdout
    assert "open-file limit" in result.stderr and "1024" in result.stderr, result.stderr


def test_importing_mlx_lm_never_lowers_the_open_file_limit():
    """mlx-lm's own call would set (2048, 4096): a higher limit, here 8192, stays as it was."""
    code = "import mlxcore, resource, mlx_lm.utils; print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192)))
    assert done.returncode == 0 and done.stdout.split() == ["8192", "8192"], done.stderr


@pytest.mark.slow
def test_a_reply_never_outgrows_the_context_of_a_long_chat(tmp_path):
    path = tmp_path / "long.mlxchat"
    first = ask(tmp_path, "--session", str(path), "--no-think", "--max-tokens", "2000", *PAIR, "-",
                stdin=LONG.encode())
    assert first.returncode == 0, first.stderr
    saved = read_saved_session(read_header(path), str(path))
    assert 0 < len(saved.target.tokens) <= CONTEXT and len(saved.draft.tokens) <= CONTEXT
    again = ask(tmp_path, "--session", str(path), "--no-think", "--max-tokens", "2000", *PAIR, "And then?")
    if again.returncode != 0:  # the chat is full: refused in one line, the file kept
        assert_one_line(again, "context")
        assert read_saved_session(read_header(path), str(path)).history == saved.history
