"""Twins: the users' models' layout, vocabulary, KV geometry and tokenizer, checked against references."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from assets import QWEN3_TOKENIZER_DIR
from twin_fixtures import (PADDED_VOCAB_EXTRA, twin_06b, twin_06b_f32,  # noqa: F401
                           twin_06b_f32_padded, twin_8b, twins_root)

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten, tree_map
from mlx_lm import convert
from mlx_lm.models import qwen3
from mlx_lm.utils import quantize_model
from bench import twins
from mlxcore.errors import TokenizerMismatchError
from mlxcore.kv.geometry import model_geometry
from mlxcore.loading import LoadedModel, check_draft_compatible, load_model
from bench.twin_build import random_model
from bench.twin_specs import TWINS, TwinSpec

KIB = 1024
QWEN3_VOCAB = 151_936  # rows of Qwen3-8B's and Qwen3-0.6B's embeddings (their config.json)
USERS_QUANTIZATION = {"group_size": 64, "bits": 4}  # config.json of the mlx-community 4-bit repos
REPO_FILES = {"config.json", "generation_config.json", "model.safetensors",
              "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"}


def files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def last_logits(model, ids: list[int]) -> mx.array:
    return model(mx.array(ids)[None])[0, -1].astype(mx.float32)


@pytest.fixture(scope="module")
def target(twin_8b) -> LoadedModel:
    return load_model(str(twin_8b))


@pytest.fixture(scope="module")
def draft(twin_06b) -> LoadedModel:
    return load_model(str(twin_06b))


# --- layout: what mlx-lm's own convert writes --------------------------------------------------

def test_the_4bit_twin_is_mlx_lm_convert_of_the_float32_twin(twin_06b, twin_06b_f32, tmp_path):
    reference = tmp_path / "converted"
    convert(str(twin_06b_f32), str(reference), quantize=True, q_group_size=64, q_bits=4,
            dtype="bfloat16")  # the real repos' dtype
    ours, theirs = files(twin_06b), files(reference)
    assert set(ours) == REPO_FILES
    # convert adds a model card, and transformers 5 moves the template out of tokenizer_config.json.
    assert set(theirs) - set(ours) == {"README.md", "chat_template.jinja"}
    for name in ("model.safetensors", "model.safetensors.index.json", "generation_config.json"):
        assert ours[name] == theirs[name], f"{name} differs from what mlx_lm.convert writes"
    ours_config, their_config = config(twin_06b), config(reference)
    assert their_config.pop("quantization") == their_config.pop("quantization_config") == {
        **USERS_QUANTIZATION, "mode": "affine"}
    assert ours_config.pop("quantization") == ours_config.pop("quantization_config") == USERS_QUANTIZATION
    their_config["torch_dtype"] = "bfloat16"  # convert casts the weights but keeps the source's name
    their_config["eos_token_id"] = 151_645  # convert copies generation_config's list into config.json
    assert ours_config == their_config


def test_8b_twin_has_the_tensors_mlx_lm_gives_a_quantized_bf16_qwen3(twin_8b):
    float_config = {k: v for k, v in config(twin_8b).items() if not k.startswith("quantization")}
    reference = qwen3.Model(qwen3.ModelArgs.from_dict(float_config))  # lazy: nothing is computed
    reference.update(tree_map(lambda p: p.astype(mx.bfloat16), reference.parameters()))
    quantize_model(reference, float_config, 64, 4)
    expected = {name: (value.shape, value.dtype) for name, value in tree_flatten(reference.parameters())}
    weights = mx.load(str(twin_8b / "model.safetensors"))
    saved = {name: (value.shape, value.dtype) for name, value in weights.items()}
    assert saved == expected
    assert "lm_head.scales" in saved  # untied, like Qwen3-8B
    scale_dtypes = {dtype for name, (_, dtype) in saved.items() if name.endswith(("scales", "biases"))}
    assert scale_dtypes == {mx.bfloat16}


def test_configs_are_qwen3s(twin_8b, twin_06b):
    for folder, layers, heads, tied in ((twin_8b, 36, 32, False), (twin_06b, 28, 16, True)):
        got = config(folder)
        assert (got["model_type"], got["vocab_size"], got["num_hidden_layers"], got["num_attention_heads"],
                got["num_key_value_heads"], got["head_dim"], got["tie_word_embeddings"]) == (
            "qwen3", QWEN3_VOCAB, layers, heads, 8, 128, tied)
        assert (got["max_position_embeddings"], got["rope_theta"], got["rms_norm_eps"]) == (40_960, 1e6, 1e-6)
        generation = json.loads((folder / "generation_config.json").read_text())
        assert {k: generation[k] for k in ("eos_token_id", "temperature", "top_k", "top_p")} == {
            "eos_token_id": [151_645, 151_643], "temperature": 0.6, "top_k": 20, "top_p": 0.95}


# --- what the engine sees ----------------------------------------------------------------------

def test_kv_bytes_per_token_are_the_real_pairs(target, draft):
    # layers x KV heads x head dim x (keys, values) x 2 bytes of bf16
    assert model_geometry(target.model).token_bytes == 36 * 8 * 128 * 2 * 2 == 144 * KIB
    assert model_geometry(draft.model).token_bytes == 28 * 8 * 128 * 2 * 2 == 112 * KIB
    assert model_geometry(target.model).dtype == mx.bfloat16


def test_tokenizer_and_template_are_qwen3s(twin_06b, draft):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (twin_06b / name).read_bytes() == (QWEN3_TOKENIZER_DIR / name).read_bytes()
    tokenizer = draft.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token)
           for token in ("<think>", "</think>", "<|im_end|>", "<|endoftext|>")}
    assert ids == {"<think>": 151_667, "</think>": 151_668, "<|im_end|>": 151_645, "<|endoftext|>": 151_643}
    assert set(tokenizer.eos_token_ids) == {151_645, 151_643}
    messages = [{"role": "user", "content": "Hi"}]
    off = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                        enable_thinking=False)
    on = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert off == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert on == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_mlx_lm_load_and_ours_give_the_same_peaked_logits(twin_8b, target):
    model, tokenizer = mlx_lm.load(str(twin_8b))
    ids = tokenizer.encode("The quick brown fox")
    logits = last_logits(target.model, ids)
    assert mx.array_equal(logits, last_logits(model, ids)).item()
    assert logits.shape == (QWEN3_VOCAB,)
    top20 = mx.sort(mx.softmax(logits))[-20:].sum().item()
    assert top20 > 0.1, f"top-20 mass {top20:.4f}: the logits are nearly flat (uniform: 0.00013)"


def test_draft_twin_pairs_with_the_target_twin(target, draft):
    check_draft_compatible(target, draft)
    with pytest.raises(TokenizerMismatchError):
        check_draft_compatible(load_model("mini-target"), draft)


def test_padded_vocab_draft(target, twin_06b_f32_padded):
    draft = load_model(str(twin_06b_f32_padded))
    padded = QWEN3_VOCAB + PADDED_VOCAB_EXTRA
    assert config(twin_06b_f32_padded)["vocab_size"] == padded
    assert draft.model.model.embed_tokens.weight.shape == (padded, 64)
    assert last_logits(draft.model, [1, 2, 3]).shape == (padded,)
    check_draft_compatible(target, draft)


# --- seeds, cache folder, builds -------------------------------------------------------------

def test_same_seed_gives_the_same_bytes(twin_06b, tmp_path):
    again = twins.twin_folder("qwen3-0.6b", bits=4, root=tmp_path)
    assert again.name == twin_06b.name and again != twin_06b
    assert files(again) == files(twin_06b)


def test_seeds_change_the_weights():
    small = replace(TWINS["qwen3-0.6b"], num_layers=1, vocab_size=256)
    def weights(seed: int) -> list[mx.array]:
        return [v for _, v in tree_flatten(random_model(small, seed=seed).parameters()) if v.ndim == 2]
    assert all(mx.array_equal(a, b).item() for a, b in zip(weights(3), weights(3)))
    assert not any(mx.array_equal(a, b).item() for a, b in zip(weights(3), weights(4)))


def test_folder_names_say_twin_bits_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(twins, "write_twin", lambda folder, *a, **k: folder.mkdir())
    assert twins.twin_folder("qwen3-8b", root=tmp_path).name.startswith("qwen3-8b-4bit-seed0-")
    assert twins.twin_folder("qwen3-8b", bits=None, seed=7, root=tmp_path).name.startswith(
        "qwen3-8b-float32-seed7-")
    assert twins.twin_folder("qwen3-0.6b", vocab_pad=64, root=tmp_path).name.startswith(
        "qwen3-0.6b-4bit-seed0-vocabpad64-")


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MLXCHAT_TWINS", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert twins.twins_root() == tmp_path / "home" / ".cache" / "mlxchat" / "twins"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert twins.twins_root() == tmp_path / "xdg" / "mlxchat" / "twins"
    monkeypatch.setenv("MLXCHAT_TWINS", str(tmp_path / "chosen"))
    assert twins.twins_root() == tmp_path / "chosen"


def test_a_failed_build_leaves_no_twin(tmp_path, monkeypatch):
    def dies_halfway(folder: Path, *args, **kwargs) -> None:
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as a user's Ctrl+C mid-build
    monkeypatch.setattr(twins, "write_twin", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        twins.twin_folder("qwen3-0.6b", root=tmp_path)
    assert not list(tmp_path.glob("qwen3-0.6b*"))  # only hidden leftovers
    monkeypatch.setattr(twins, "write_twin", lambda folder, *a, **k: (folder.mkdir(),
                                                                       (folder / "done").touch()))
    folder = twins.twin_folder("qwen3-0.6b", root=tmp_path)
    assert [p.name for p in folder.iterdir()] == ["done"]  # the half build was not reused


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    builds, start = [], threading.Barrier(4)
    def slow_build(folder: Path, *args, **kwargs) -> None:
        builds.append(folder)
        folder.mkdir()
        threading.Event().wait(0.2)  # widen the window in which a second builder could start
    monkeypatch.setattr(twins, "write_twin", slow_build)
    results: list[Path] = []
    def call() -> None:
        start.wait()
        results.append(twins.twin_folder("qwen3-0.6b", root=tmp_path))
    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len(set(results)) == 1 and len(results) == 4


def test_bad_requests_are_value_errors():
    with pytest.raises(ValueError, match="unknown twin"):
        twins.twin_folder("qwen3-32b")
    with pytest.raises(ValueError, match="bits"):
        twins.twin_folder("qwen3-8b", bits=8)
    with pytest.raises(ValueError, match="multiple of 64"):
        replace(TWINS["qwen3-8b"], hidden_size=100)
    with pytest.raises(ValueError, match="evenly"):
        TwinSpec(mirrors="x", num_layers=1, kv_heads=3, head_dim=8, num_heads=4, hidden_size=64,
                 intermediate_size=64, tie_embeddings=True)


def test_cli_prints_the_folder(twin_06b, twins_root):
    run = subprocess.run([sys.executable, "-m", "bench.twins", "qwen3-0.6b", "--bits", "4",
                          "--root", str(twins_root)], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (0, f"{twin_06b}\n"), run.stderr
    with pytest.raises(SystemExit) as exit_:
        twins.main(["qwen3-32b"])
    assert exit_.value.code == 2
