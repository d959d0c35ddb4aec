"""Errors while loading say what went wrong: memory, disk, network, a bug, no compiler, a long prompt."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from assets import MODELS_DIR
from tiny_models import tiny_qwen3, write_model_folder

import mlxcore  # noqa: F401
import httpx2
from huggingface_hub.errors import HfHubHTTPError
from mlxcore import compile_support, fast_exp, hub, loading
from mlxcore.engine import Engine
from mlxcore.errors import ModelLoadError
from mlxcore.launch import warm_up
from mlxcore.loading import load_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_model_folder(tiny_qwen3(0), tmp_path / "tiny", MODELS_DIR / "mini-target")


def raising(error: BaseException):
    def fake(*args, **kwargs):
        raise error
    return fake


# --- out of memory while loading ------------------------------------------------------------------

@pytest.mark.parametrize("error", [
    RuntimeError("[metal::malloc] Attempting to allocate 17179869184 bytes which is greater than the maximum "
                 "allowed buffer size of 8589934592 bytes."),
    RuntimeError("[METAL] Command buffer execution failed: Insufficient Memory "
                 "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)"),
    MemoryError("std::bad_alloc"),
], ids=["metal-malloc", "metal-command-buffer", "cpu"])
def test_out_of_memory_is_reported_as_memory(folder: Path, monkeypatch, error):
    monkeypatch.setattr(loading, "mlx_lm_load_model", raising(error))
    weights = (folder / "model.safetensors").stat().st_size
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(folder))
    message = str(caught.value)
    assert message.startswith(f"Not enough memory to load tiny: it needs about {weights / 1e6:.1f} MB and this "
                              "machine has ")
    assert "Use a smaller model" in message and "close other apps" in message
    assert "download" not in message


def test_unreadable_weights_still_say_download_again(folder: Path, monkeypatch):
    monkeypatch.setattr(loading, "mlx_lm_load_model", raising(RuntimeError("[load_safetensors] bad header")))
    with pytest.raises(ModelLoadError, match="cannot be read .*download the model again"):
        load_model(str(folder))


# --- downloads --------------------------------------------------------------------------------------

@pytest.fixture
def online(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("MLXCHAT_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_disk_full_during_download_has_its_own_message(online, monkeypatch):
    full = OSError(errno.ENOSPC, "No space left on device", str(online / "blobs" / "x.incomplete"))
    monkeypatch.setattr(hub, "snapshot_download", raising(full))
    with pytest.raises(ModelLoadError, match=r"Downloading 'org/big' stopped: the disk that holds the hub cache "
                                             rf"\({online}\) is full\. Free some space"):
        load_model("org/big")


@pytest.mark.parametrize("error", [
    httpx2.ConnectError("[Errno -3] Temporary failure in name resolution"),
    httpx2.ReadTimeout("The read operation timed out"),
    TimeoutError("timed out"),
], ids=["connect", "read-timeout", "socket-timeout"])
def test_network_errors_say_check_the_network(online, monkeypatch, error):
    monkeypatch.setattr(hub, "snapshot_download", raising(error))
    with pytest.raises(ModelLoadError, match=rf"Downloading 'org/big' failed \({type(error).__name__}: .*\); "
                                             "check the network connection"):
        load_model("org/big")


def test_hub_http_error_says_so(online, monkeypatch):
    request = httpx2.Request("GET", "https://huggingface.co/api/models/org/big")
    response = httpx2.Response(502, request=request)
    monkeypatch.setattr(hub, "snapshot_download", raising(HfHubHTTPError("502 Bad Gateway", response=response)))
    with pytest.raises(ModelLoadError, match=r"failed \(HfHubHTTPError: 502 Bad Gateway\); check the network"):
        load_model("org/big")


def test_unwritable_cache_is_a_disk_error(online, monkeypatch):
    denied = PermissionError(errno.EACCES, "Permission denied", str(online / "models--org--big"))
    monkeypatch.setattr(hub, "snapshot_download", raising(denied))
    with pytest.raises(ModelLoadError, match=r"failed writing to the hub cache .*Permission denied.*can be written"):
        load_model("org/big")


@pytest.mark.parametrize("bug", [TypeError("snapshot_download() got an unexpected keyword argument 'x'"),
                                 AttributeError("'NoneType' object has no attribute 'sha'")])
def test_a_bug_is_not_dressed_up_as_a_failed_download(online, monkeypatch, bug):
    monkeypatch.setattr(hub, "snapshot_download", raising(bug))
    with pytest.raises(type(bug)) as caught:
        load_model("org/big")
    assert caught.value is bug


# --- a compiler that does not work ----------------------------------------------------------------

@pytest.fixture
def no_compiler(monkeypatch):
    """mx.compile raises during the probe, as it does on a machine without a C++ compiler."""
    def clear():
        for cached in (compile_support.compile_failure, compile_support.compile_works, fast_exp._parts):
            cached.cache_clear()
    clear()
    with monkeypatch.context() as patch:
        patch.setattr(compile_support.mx, "compile", raising(RuntimeError("Failed to compile: c++ not found")))
        compile_support.compile_failure()
    monkeypatch.setattr(compile_support, "_told", False)
    yield
    clear()  # the next test probes the real compiler again


def test_failed_compile_is_told_once_per_process(no_compiler):
    told: list[str] = []
    for seed in (1, 2):  # two engines, as after switching models: still one notice
        engine = Engine(tiny_qwen3(seed), draft_model=tiny_qwen3(seed + 10, layers=1))
        assert not engine.target_forward.enabled and not engine.draft_forward.enabled
        warm_up(engine, told.append)
    assert told == ["decoding without compiled kernels: RuntimeError: Failed to compile: c++ not found"]


def test_compile_turned_off_by_the_user_is_not_a_failure(no_compiler, monkeypatch):
    monkeypatch.setenv("MLXCHAT_COMPILE", "0")
    told: list[str] = []
    warm_up(Engine(tiny_qwen3(3)), told.append)
    assert told == []


# --- transformers' warning about long inputs ---------------------------------------------------------

def test_long_prompt_gives_our_message_only():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--model", "mini-target", "--no-draft", "-"],
                            input="word " * 5000, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert re.match(r"mlxchat: The prompt has \d{4} tokens, more than the model's context of 4096", result.stderr)
    assert "Token indices sequence length" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
