"""Model loading: embedded names, folders, a fake offline hub, fingerprints, drafts, bad files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assets import MODELS_DIR
from fake_hub import add_to_fake_hub
from tiny_models import tiny_qwen3, write_model_folder

import mlx.core as mx
from huggingface_hub.errors import LocalEntryNotFoundError
from mlxcore import defaults, hub
from mlxcore.errors import ModelLoadError, TokenizerMismatchError
from mlxcore.fingerprint import model_fingerprint
from mlxcore.hub import _callback_tqdm
from assets import embedded_names
from mlxcore.loading import check_draft_compatible, load_model

TOKENIZER_SOURCE = MODELS_DIR / "mini-target"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A tiny random Qwen3 in the MLX layout, with the embedded tokenizer."""
    return write_model_folder(tiny_qwen3(0), tmp_path / "tiny", TOKENIZER_SOURCE)


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache in tmp, with downloads off: set through the environment only."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def copy_folder(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# --- where models come from -------------------------------------------------------------

def test_embedded_name_loads():
    loaded = load_model("mini-target")
    assert loaded.name == "mini-target"
    assert loaded.path == MODELS_DIR / "mini-target"
    assert "mini-target" in embedded_names()
    assert loaded.tokenizer.encode("hello") and loaded.tokenizer.eos_token_ids
    assert loaded.config["model_type"] == "qwen3"


def test_folder_loads_and_runs(folder: Path):
    loaded = load_model(str(folder))
    assert (loaded.name, loaded.path) == ("tiny", folder.resolve())
    logits = loaded.model(mx.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, loaded.config["vocab_size"])
    assert len(loaded.fingerprint) == 16


def test_hub_repo_loads_from_cache_while_offline(folder: Path, offline_hub: Path):
    snapshot = add_to_fake_hub(offline_hub, "org/tiny", folder)
    loaded = load_model("org/tiny")
    assert loaded.name == "org/tiny"
    assert loaded.path == snapshot.resolve()
    assert loaded.fingerprint == load_model(str(folder)).fingerprint  # same files, same fingerprint


def test_hub_repo_missing_while_offline_says_so(offline_hub: Path):
    with pytest.raises(ModelLoadError, match="not in the local hub cache .* downloads are off"):
        load_model("org/absent")


def _raising(error: Exception):
    def fake_snapshot_download(*args, **kwargs):
        raise error
    return fake_snapshot_download


def test_unreachable_hub_says_so(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("MLXCHAT_OFFLINE", raising=False)
    try:
        raise LocalEntryNotFoundError("cannot find the snapshot") from ConnectionError("no route")
    except LocalEntryNotFoundError as error:
        monkeypatch.setattr(hub, "snapshot_download", _raising(error))
    with pytest.raises(ModelLoadError, match=r"Could not reach the hub .* \(ConnectionError: no route\)"):
        load_model("org/absent")


def test_failed_download_says_so(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(hub, "snapshot_download", _raising(ConnectionResetError("connection reset by peer")))
    with pytest.raises(ModelLoadError, match=r"Downloading 'org/big' failed \(ConnectionResetError: connection "
                                             r"reset by peer\); check the network"):
        load_model("org/big")


def test_existing_folder_wins_over_repo_id(folder: Path, tmp_path: Path, monkeypatch, offline_hub):
    copy_folder(folder, tmp_path / "org" / "local")
    monkeypatch.chdir(tmp_path)
    assert load_model("org/local").path == (tmp_path / "org" / "local").resolve()


def test_progress_callback_gets_byte_counts():
    seen: list[tuple[int, int]] = []
    bar = _callback_tqdm(lambda done, total: seen.append((done, total)))(
        name="huggingface_hub.snapshot_download", total=0, unit="B")
    bar.total = 300  # snapshot_download grows the total as files start
    bar.update(100)
    bar.update(200)
    files_bar = _callback_tqdm(lambda *_: seen.append((-1, -1)))(total=2)
    files_bar.update(1)  # the file-count bar is not reported
    assert seen == [(100, 300), (300, 300)]


# --- fingerprint ------------------------------------------------------------------------

def test_fingerprint_is_stable_across_processes(folder: Path):
    code = ("import sys; from pathlib import Path; from mlxcore.fingerprint import model_fingerprint; "
            "print(model_fingerprint(Path(sys.argv[1])))")
    other = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                           check=True, cwd=Path(__file__).parents[1]).stdout.strip()
    assert other == model_fingerprint(folder) == model_fingerprint(folder)


@pytest.mark.parametrize("change", ["weights", "config", "template", "tokenizer"])
def test_fingerprint_changes_with_what_decides_the_output(folder: Path, tmp_path: Path, change: str):
    other = copy_folder(folder, tmp_path / "other")
    if change == "weights":  # same shapes, other values
        write_model_folder(tiny_qwen3(1), other, TOKENIZER_SOURCE)
    elif change == "config":
        edit_json(other / "config.json", lambda c: c.update(rope_theta=20000.0))
    elif change == "template":
        edit_json(other / "tokenizer_config.json",
                  lambda c: c.update(chat_template="{{ messages[0].content }}"))
    else:
        edit_json(other / "tokenizer.json", lambda t: t["added_tokens"][0].update(content="<|x|>"))
    assert model_fingerprint(other) != model_fingerprint(folder)


# --- draft compatibility ----------------------------------------------------------------

def test_draft_with_same_tokenizer_is_compatible(folder: Path, tmp_path: Path):
    draft = write_model_folder(tiny_qwen3(1, layers=1), tmp_path / "draft", TOKENIZER_SOURCE)
    check_draft_compatible(load_model(str(folder)), load_model(str(draft)))


def test_draft_with_other_vocabulary_is_refused(folder: Path, tmp_path: Path):
    draft = copy_folder(folder, tmp_path / "draft")

    def swap_two_ids(tokenizer: dict) -> None:
        vocab = tokenizer["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[10:12]
        vocab[a], vocab[b] = vocab[b], vocab[a]

    edit_json(draft / "tokenizer.json", swap_two_ids)
    with pytest.raises(TokenizerMismatchError, match=r"tokenizers differ \(2 of \d+ tokens differ"):
        check_draft_compatible(load_model(str(folder)), load_model(str(draft)))


def test_draft_with_other_end_token_is_refused(folder: Path, tmp_path: Path):
    draft = copy_folder(folder, tmp_path / "draft")
    target = load_model(str(folder))
    edit_json(draft / "config.json",
              lambda c: c.update(eos_token_id=max(target.tokenizer.eos_token_ids) + 1))
    with pytest.raises(TokenizerMismatchError, match="end-of-text token ids differ"):
        check_draft_compatible(target, load_model(str(draft)))


# --- bad input: one clear line each ----------------------------------------------------

def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


BREAKAGES = {
    "no config": (lambda f: (f / "config.json").unlink(), "has no config.json"),
    "config not JSON": (lambda f: (f / "config.json").write_text("{oops"), "is not valid JSON"),
    "config a list": (lambda f: (f / "config.json").write_text("[1]"), "not an object"),
    "no model_type": (lambda f: edit_json(f / "config.json", lambda c: c.pop("model_type")),
                      "has no model_type"),
    "unknown model_type": (lambda f: edit_json(f / "config.json", lambda c: c.update(model_type="zork")),
                           "model_type 'zork' .* is not supported"),
    "another architecture": (lambda f: edit_json(f / "config.json", lambda c: c.update(model_type="llama")),
                             "is a llama model; mlxchat runs Qwen3, Qwen3-MoE, Qwen3.5 and Qwen3-Next models"),
    "hybrid attention": (lambda f: edit_json(f / "config.json", lambda c: c.update(model_type="qwen3_next")),
                         "does not describe a qwen3_next model"),
    "config key missing": (lambda f: edit_json(f / "config.json", lambda c: c.pop("hidden_size")),
                           "does not describe a qwen3 model"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "has no weights"),
    "truncated weights": (lambda f: _truncate(f / "model.safetensors"), "truncated"),
    "garbage weights": (lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 64),
                        "not a usable safetensors file"),
    "wrong shapes": (lambda f: edit_json(f / "config.json", lambda c: c.update(intermediate_size=99)),
                     "do not fit its config.json"),
    "no tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "has no tokenizer"),
    "tokenizer not JSON": (lambda f: (f / "tokenizer.json").write_text("{"), "tokenizer .* cannot be read"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_broken_folder_gives_one_clear_line(folder: Path, breakage: str):
    breaking, message = BREAKAGES[breakage]
    breaking(folder)
    with pytest.raises(ModelLoadError, match=message) as caught:
        load_model(str(folder))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("ref", "message"), [
    ("no-such-model", r"Unknown model 'no-such-model': not an embedded model \("),
    ("./missing/folder", "There is no folder"),
    ("", "No model given"),
])
def test_unknown_refs_are_clear(ref: str, message: str, offline_hub: Path):
    with pytest.raises(ModelLoadError, match=message):
        load_model(ref)


def test_unknown_name_lists_the_embedded_models():
    with pytest.raises(ModelLoadError, match=r"not an embedded model \(.*mini-target"):
        load_model("mini-targte")


def test_a_file_is_not_a_model_folder(folder: Path):
    with pytest.raises(ModelLoadError, match="is a file"):
        load_model(str(folder / "config.json"))


# --- defaults ---------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["HF_HUB_OFFLINE", "MLXCHAT_OFFLINE"])
def test_default_pair_offline_is_embedded(flag: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(flag, "1")
    target, draft, reason = defaults.default_pair()
    assert (target, draft) == ("mini-target", "mini-draft")
    assert flag in reason and "embedded" in reason


def test_default_pair_uses_cached_online_models(folder: Path, offline_hub: Path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(defaults, "hub_reachable", lambda: pytest.fail("no network check needed"))
    add_to_fake_hub(offline_hub, defaults.ONLINE_TARGET, folder)
    add_to_fake_hub(offline_hub, defaults.ONLINE_DRAFT, folder)
    assert defaults.default_pair()[:2] == (defaults.ONLINE_TARGET, defaults.ONLINE_DRAFT)


def test_default_pair_without_hub_is_embedded(offline_hub: Path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(defaults, "hub_reachable", lambda: False)
    target, draft, reason = defaults.default_pair()
    assert (target, draft) == ("mini-target", "mini-draft")
    assert "cannot be reached" in reason


def test_hub_check_goes_through_the_https_proxy(monkeypatch: pytest.MonkeyPatch):
    """Behind a proxy the hub's own address may be unreachable: the check connects where requests would go."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as proxy:
        monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert defaults.hub_reachable(timeout=5)
        monkeypatch.delenv("HTTPS_PROXY")
        assert not defaults.hub_reachable(timeout=1)
