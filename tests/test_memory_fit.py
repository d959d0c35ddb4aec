"""The machine's memory decides the default pair and refuses a model that cannot fit, before any download.

The RAM is faked through the one seam, ``MLXCHAT_MEMORY``; the expected figures are read from docs/memory.md's
table, so the docs and the code cannot drift apart.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlxcore import defaults, memory_fit
from mlxcore.configs import KVConfig
from mlxcore.engine import Engine
from mlxcore.errors import ModelLoadError
from mlxcore.out_of_memory import is_out_of_memory

ROOT = Path(__file__).resolve().parent.parent
ROWS = re.findall(r"^\| (\d+) GB \| ([\d.]+) GB \| (Qwen3-[\w.]+-4bit) \+ 0\.6B \| [\d.]+ GB \| ([\d.]+) GB \| ([\d,]+) \|",
                  (ROOT / "docs" / "memory.md").read_text(), flags=re.M)


def test_the_docs_table_has_the_8_16_and_64_gb_rows():
    assert [row[0] for row in ROWS] == ["8", "16", "64"]


@pytest.mark.parametrize(("ram", "usable", "target", "kv_gb", "tokens"), ROWS)
def test_the_default_pair_and_kv_budget_are_the_docs_table(ram: str, usable: str, target: str, kv_gb: str,
                                                           tokens: str, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path):
    monkeypatch.setenv(memory_fit.MEMORY_ENV, f"{ram}GiB")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # nothing cached: the choice is the memory's alone
    for flag in ("MLXCHAT_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setattr(defaults, "hub_reachable", lambda: True)
    chosen, draft, note = defaults.default_pair()
    assert (chosen, draft) == (f"mlx-community/{target}", "mlx-community/Qwen3-0.6B-4bit"), note
    ram_bytes = memory_fit.machine_ram()
    assert ram_bytes == int(ram) * 2**30
    room = memory_fit.model_memory(ram_bytes)
    assert f"{room / 1e9:.1f}" == usable
    weights = memory_fit.QWEN3_4BIT[chosen][0] + memory_fit.QWEN3_4BIT[draft][0]
    assert f"{memory_fit.kv_room(room, weights) / 1e9:.1f}" == kv_gb
    assert memory_fit.pair_tokens(chosen, ram_bytes) == int(tokens.replace(",", "")) >= memory_fit.USEFUL_CONTEXT


def test_a_model_larger_than_the_memory_is_refused_before_any_download(tmp_path: Path):
    """Across the CLI: one line naming both sizes, exit status 2, nothing in the hub cache, no network touched
    (the endpoint is a closed loopback port)."""
    env = {**os.environ, memory_fit.MEMORY_ENV: "16GiB", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)}
    env.pop("MLXCHAT_OFFLINE", None)
    done = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--no-draft", "--model",
                           "mlx-community/Qwen3-32B-4bit", "Hi"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "18.4 GB" in lines[0] and "11.5 GB" in lines[0] and "--model" in lines[0], done.stderr
    assert not (tmp_path / "hub").exists() or not any((tmp_path / "hub").rglob("*.safetensors"))


def test_an_unknown_repo_is_sized_from_the_hub_list_and_never_downloaded(monkeypatch: pytest.MonkeyPatch):
    from mlxcore import hub, launch, loading

    monkeypatch.setenv(memory_fit.MEMORY_ENV, "8GiB")
    monkeypatch.setattr(memory_fit, "hub_weights", lambda repo: 70 * 10**9)
    monkeypatch.setattr(hub, "download", lambda *a, **k: pytest.fail("downloaded"))
    monkeypatch.setattr(loading, "download", lambda *a, **k: pytest.fail("downloaded"), raising=False)
    with pytest.raises(ModelLoadError, match=r"70\.0 GB of memory, more than the 5\.7 GB") as refused:
        launch.open_engine("someone/Huge-70B-4bit")
    assert "\n" not in str(refused.value)


def test_advice_never_asks_for_more_than_the_machine_has():
    """A budget the machine set: more max_kv would swap; one the user set: a larger one is the way."""
    assert "larger max_kv" not in Engine.more_kv_advice.fget(SimpleNamespace(kv=KVConfig()))
    assert "larger max_kv" in Engine.more_kv_advice.fget(SimpleNamespace(kv=KVConfig(max_kv_bytes=10**9)))


def test_mlx_malloc_failure_is_out_of_memory():
    assert is_out_of_memory(RuntimeError("[malloc] Unable to allocate 4294967296 bytes."))
