"""The embedded DFlash block drafter: its folder is in z-lab's published layout, and its training lowers the loss.

The layout is what z-lab publishes for its Qwen3 drafters (e.g. Qwen3-8B-DFlash-b16: config.json and
model.safetensors as its ``DFlashDraftModel`` saves them, read by dflash/model.py and dflash/model_mlx.py):
written out below by hand, so that a change on our side shows up as a difference from theirs. The training
check needs torch (the recipe's train extra) and is skipped without it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from assets import MODELS_DIR

FOLDER = MODELS_DIR / "mini-dflash"
TARGET = MODELS_DIR / "mini-target"

# The fields of z-lab's published drafter configs (transformers' Qwen3 fields plus DFlash's own), without
# "transformers_version", which records the library that saved them.
CONFIG_FIELDS = {
    "architectures", "attention_bias", "attention_dropout", "auto_map", "block_size", "bos_token_id",
    "dflash_config", "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "initializer_range",
    "intermediate_size", "layer_types", "max_position_embeddings", "max_window_layers", "model_type",
    "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "num_target_layers", "rms_norm_eps",
    "rope_scaling", "rope_theta", "sliding_window", "tie_word_embeddings", "use_cache", "use_sliding_window",
    "vocab_size",
}
LAYER_WEIGHTS = (
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)


def safetensors_header(path: Path) -> dict:
    """Tensor names, dtypes and shapes from a safetensors file's header (no torch needed)."""
    with path.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def test_the_folder_follows_z_labs_published_layout():
    assert sorted(p.name for p in FOLDER.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((FOLDER / "config.json").read_text())
    assert set(cfg) == CONFIG_FIELDS
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    assert set(cfg["dflash_config"]) == {"mask_token_id", "target_layer_ids"}
    assert cfg["dtype"] == "bfloat16"
    layers = cfg["num_hidden_layers"]
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{name}" for i in range(layers) for name in LAYER_WEIGHTS}
    header = safetensors_header(FOLDER / "model.safetensors")
    assert set(header) == expected, "no embed_tokens or lm_head: the drafter borrows the target's"
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    hidden, ids = cfg["hidden_size"], cfg["dflash_config"]["target_layer_ids"]
    assert header["fc.weight"]["shape"] == [hidden, len(ids) * hidden]
    assert header["layers.0.self_attn.q_proj.weight"]["shape"] == [cfg["num_attention_heads"] * cfg["head_dim"], hidden]
    assert header["layers.0.self_attn.k_proj.weight"]["shape"] == [cfg["num_key_value_heads"] * cfg["head_dim"], hidden]
    assert header["layers.0.mlp.down_proj.weight"]["shape"] == [hidden, cfg["intermediate_size"]]
    assert (FOLDER / "model.safetensors").stat().st_size < 4_000_000


def test_the_folder_matches_the_embedded_target():
    cfg = json.loads((FOLDER / "config.json").read_text())
    target = json.loads((TARGET / "config.json").read_text())
    assert cfg["hidden_size"] == target["hidden_size"] and cfg["vocab_size"] == target["vocab_size"]
    assert cfg["num_target_layers"] == target["num_hidden_layers"]
    # The last layer is left out: transformers reads it after the final norm, a layer hook before it.
    assert all(0 <= i < target["num_hidden_layers"] - 1 for i in cfg["dflash_config"]["target_layer_ids"])
    assert 4 <= cfg["block_size"] <= 16
    tokenizer = json.loads((TARGET / "tokenizer.json").read_text())
    special = {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
    assert special.get(cfg["dflash_config"]["mask_token_id"]) == "<|endoftext|>", "the pad token, never in a chat"


def test_a_few_seeded_training_steps_lower_the_block_loss():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from recipe import corpus
    from recipe.config import SEED, DraftPlan, ModelShape
    from recipe.data import batches, to_example
    from recipe.dflash import DFlashDrafter, DFlashSpec
    from recipe.dflash_train import block_loss, train_drafter

    target = transformers.Qwen3ForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(TARGET))
    examples = [to_example(tok, json.loads(c.to_json())) for c in corpus.generate(SEED, 32, heldout=False)]
    spec = DFlashSpec(ModelShape(1, 192, 6, 2, 32, 384), 8, (1, 4), 0)
    drafter = DFlashDrafter(spec, SEED)
    ids, labels = (torch.from_numpy(a) for a in next(batches(examples, 2048, 0, np.random.default_rng(0))))

    def loss() -> float:
        with torch.no_grad():
            return block_loss(drafter, target, ids, labels, 8, 4.0, torch.Generator().manual_seed(0)).item()

    before = loss()
    plan = DraftPlan(32, 2.0, 2048, 8, 3e-3, 2, 4.0)
    train_drafter(drafter, target, examples, plan, SEED, Path("/dev/null"))
    assert loss() < 0.7 * before


def test_the_replayed_rounds_are_those_of_a_real_speculative_decode():
    """``measure`` replays rounds from teacher-forced passes; a plain speculative decode must give the same."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from recipe import corpus
    from recipe.data import to_example
    from recipe.dflash import context_features, load
    from recipe.dflash_eval import EVAL_SEED, block_matches, decode, walk

    target = transformers.Qwen3ForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(TARGET))
    drafter = load(FOLDER)
    rounds = []
    prompts = [to_example(tok, json.loads(c.to_json())).prompt for c in corpus.generate(EVAL_SEED, 12, heldout=True)]
    for prompt in [p for p in prompts if len(p) < 80][:2]:  # short ones: every round recomputes everything
        reply, lengths = decode(drafter, target, prompt, 6, tok.eos_token_id, 40)
        plain = list(prompt)
        with torch.inference_mode():
            while plain[-1] != tok.eos_token_id and len(plain) - len(prompt) < len(reply):
                plain.append(int(target(input_ids=torch.tensor([plain])).logits[0, -1].argmax()))
        assert reply == plain[len(prompt):], "greedy verification changes nothing"
        with torch.inference_mode():
            feats = context_features(target(input_ids=torch.tensor([plain]), output_hidden_states=True).hidden_states,
                                     drafter.spec.target_layer_ids)
        replayed = walk(block_matches(drafter, target, [(plain, len(prompt))], 6, feats)[0], len(reply))
        assert replayed[:-1] == lengths[:-1], "the same rounds (the last one may be cut by max_tokens)"
        rounds += lengths
    assert sum(rounds) / len(rounds) > 2.0, "the shipped drafter guesses more than one token a round"
