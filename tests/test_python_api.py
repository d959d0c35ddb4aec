"""The Python API as README shows it: a chat in three lines, and light package imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREE_LINES = """
from mlxcore import open_engine
from sessions import ChatSession
print(ChatSession(open_engine().engine).send("What is 12 + 7?"))
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_a_chat_in_three_lines():
    result = run(THREE_LINES)
    assert result.returncode == 0, result.stderr
    assert "19" in result.stdout.split("</think>")[-1]


def test_the_package_tops_export_what_a_program_needs_and_load_mlx_only_when_used():
    result = run("import sys, mlxcore, sessions\n"
                 "print('mlx.core' in sys.modules)\n"
                 "from mlxcore import Engine, GenerationParams, KVConfig, ModelChoice, TokenEvent, open_engine\n"
                 "from sessions import ChatSession, SessionStore\n"
                 "print('mlx.core' in sys.modules, GenerationParams().temperature)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "0.0"]
    missing = run("import mlxcore; mlxcore.no_such_name")
    assert missing.returncode != 0 and "no attribute 'no_such_name'" in missing.stderr
