"""Defaults that suit the model: its generation_config.json's sampling, no fixed reply cap, a reply cut while
thinking stored so that the next turn's template is well formed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assets import MODELS_DIR
from mlxcore.errors import ModelLoadError
from mlxcore.generation_config import read_generation_defaults
from mlxcore.launch import open_engine
from mlxcore.params import GenerationParams
from session_kill_helper import tiny_engine
from sessions.chat_session import ChatSession

ROOT = Path(__file__).resolve().parent.parent
QWEN3 = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
         "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}


def folder_with(tmp_path: Path, config: dict | str | None) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(MODELS_DIR / "mini-target", folder)
    if config is not None:
        (folder / "generation_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return folder


@pytest.mark.parametrize("config,expected", [
    (QWEN3, {"temperature": 0.6, "top_k": 20, "top_p": 0.95}),
    ({"do_sample": False, "temperature": 0.6}, {"temperature": 0.0}),
    ({"temperature": -1, "top_p": 2.0, "top_k": 2.5, "min_p": 0.05, "repetition_penalty": "x"}, {"min_p": 0.05}),
    ({}, {}),
])
def test_the_files_sampling_values_are_read_and_bad_ones_left_out(tmp_path, config, expected):
    assert read_generation_defaults(folder_with(tmp_path, config)) == expected


def test_no_file_means_mlxchats_defaults_and_a_broken_one_is_an_error(tmp_path):
    assert read_generation_defaults(folder_with(tmp_path, None)) == {}
    with pytest.raises(ModelLoadError, match="generation_config.json"):
        read_generation_defaults(folder_with(tmp_path / "b", "{ nope"))


def test_a_new_chat_samples_as_the_model_recommends(tmp_path):
    engine = open_engine(str(folder_with(tmp_path, QWEN3))).engine
    params = ChatSession(engine).params
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.6, 0.95, 20, 0.0)
    assert params.max_tokens is None
    assert ChatSession(open_engine("mini-target").engine).params == GenerationParams(), "no file: mlxchat's own"


def test_with_no_max_tokens_a_reply_ends_where_the_context_does():
    engine = tiny_engine("paged", draft=False)
    engine.context_length, engine.eos_ids = 96, set()
    session = ChatSession(engine, params=GenerationParams(max_tokens=None))
    session.send("Hello there.")
    stats = session.last_stats
    assert stats.finish_reason == "length" and stats.prompt_tokens + stats.generated_tokens == 96


def test_a_reply_cut_while_thinking_is_closed_and_the_chat_goes_on():
    engine = open_engine("mini-target").engine
    session = ChatSession(engine, params=GenerationParams(max_tokens=6), enable_thinking=True)
    reply = session.send("What is 12 + 7?")
    assert reply.startswith("<think>") and "</think>" not in reply
    assert session.cut_in_thinking and session.history[-1].content == reply.rstrip("\n") + "\n</think>\n\n"
    session.params = GenerationParams(max_tokens=60)
    session.send("What is 3 + 4?")
    assert not session.cut_in_thinking and "</think>" in session.history[-1].content


def test_ask_says_when_the_reply_was_cut_while_thinking():
    result = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--model", "mini-target", "--no-draft",
                             "--max-tokens", "6", "What is 12 + 7?"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert result.returncode == 0, result.stderr
    assert "cut off while thinking" in result.stderr and "--max-tokens" in result.stderr
