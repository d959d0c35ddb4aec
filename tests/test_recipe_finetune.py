"""The recipe's fine-tuning stage: what each round trains on, and a tokenizer that keeps the base pair's tokens.

No training here (torch is not in the test extra): the rounds' conversations and the tokenizer the stage
writes, checked against the shipped pair's own tokenizer files and the recipe's held-out split.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from assets import MODELS_DIR
from recipe import finetune
from recipe.conversation import TOOL_GROUPS, is_heldout
from recipe.template import CHAT_TEMPLATE


def test_a_round_trains_on_its_parts_from_the_training_side_only(tmp_path, monkeypatch):
    monkeypatch.setattr(finetune, "WORK", tmp_path)
    small = finetune._round(5, 1e-4, (2, 1), (30, finetune.TOOL_GROUPS), (40, finetune.PLAIN), (20, ["recall"]))
    convs = finetune.mix(small)
    groups = Counter(c["group"] for c in convs)
    assert sum(groups[g] for g in TOOL_GROUPS) == 30 and groups["recall"] >= 20 and len(convs) == 90
    assert all(bool(c["tools"]) == (c["group"] in TOOL_GROUPS) for c in convs)
    assert [c["group"] for c in convs][:30] != [c["group"] for c in convs if c["group"] in TOOL_GROUPS][:30], \
        "shuffled, not part after part"
    assert finetune.mix(small) == convs, "a round's conversations are the same every time"
    assert (tmp_path / "finetune.jsonl").is_file(), "written where the stage keeps its work"


def test_no_round_trains_on_a_held_out_conversation():
    from recipe import corpus

    for r in finetune.ROUNDS:
        for i, (_, groups) in enumerate(r.parts):
            sample = corpus.generate(r.seed + 10 + i, 50, heldout=False, groups=list(groups))
            assert not any(is_heldout(c.key) for c in sample)


def test_the_stage_keeps_the_base_tokenizer_and_adds_only_the_tools_template(tmp_path):
    base = MODELS_DIR / "mini-target"
    out = finetune.tokenizer_with_tools(base, tmp_path / "tok")
    assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    ours, theirs = (json.loads((d / "tokenizer_config.json").read_text()) for d in (out, base))
    assert ours.pop("chat_template") == CHAT_TEMPLATE and "tools" in CHAT_TEMPLATE
    theirs.pop("chat_template")
    assert ours == theirs


def test_the_tools_template_writes_plain_conversations_as_the_base_learned_them(tmp_path, monkeypatch):
    # the base is the pair before tools: the shipped tokenizer, with the template it was trained with
    base = tmp_path / "base"
    base.mkdir()
    (base / "tokenizer.json").write_bytes((MODELS_DIR / "mini-target" / "tokenizer.json").read_bytes())
    config = json.loads((MODELS_DIR / "mini-target" / "tokenizer_config.json").read_text())
    config["chat_template"] = (Path(__file__).parent / "fixtures" / "pre_tools_chat_template.jinja").read_text()
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    monkeypatch.setattr(finetune, "WORK", tmp_path)
    plain = finetune.mix(finetune._round(9, 1e-4, (2, 1), (40, finetune.PLAIN)))
    finetune._same_without_tools(base, plain)  # raises if one differs
    tools = finetune.mix(finetune._round(9, 1e-4, (2, 1), (3, finetune.TOOL_GROUPS)))
    try:
        finetune._same_without_tools(base, tools)
    except RuntimeError as error:
        assert "writes a plain conversation differently" in str(error)
    else:
        raise AssertionError("a conversation with tools must read differently under the base template")


def test_the_blend_keeps_its_share_of_the_fine_tuned_weights_and_the_rest_of_the_base(tmp_path):
    import numpy as np
    import pytest
    from safetensors.numpy import load_file, save_file

    tuned, base = tmp_path / "tuned", tmp_path / "base"
    rng = np.random.default_rng(0)
    weights = {}
    for name in ("mini-target", "mini-draft"):
        for folder in (tuned, base):
            (folder / name).mkdir(parents=True)
            w = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
            save_file(w, folder / name / "model.safetensors")
            weights[folder, name] = w
    finetune.blend(tuned, base, 0.9)
    for name in ("mini-target", "mini-draft"):
        mixed = load_file(tuned / name / "model.safetensors")
        for key in ("a", "b"):
            assert mixed[key].dtype == np.float32
            np.testing.assert_allclose(mixed[key], 0.9 * weights[tuned, name][key] + 0.1 * weights[base, name][key],
                                       rtol=1e-6)
    save_file({"a": weights[base, "mini-draft"]["a"]}, base / "mini-draft" / "model.safetensors")
    with pytest.raises(RuntimeError, match="not the fine-tuned pair's"):
        finetune.blend(tuned, base)
