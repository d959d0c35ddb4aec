"""Tools as a fine-tuning stage: a trained pair goes on learning tool conversations beside its own tasks.

Training tools into the corpus from the start cost the target its copying of numbers and names (the
builds in recipe/README.md); a pair that already copies learns the tool format on top, in rounds whose
learning rate falls and whose replay leans on what the first round unlearned (recall, strings). The
base pair's tokenizer is kept, so every token it knows keeps its meaning: where it has no tool tags,
they are spelled in its pieces (``<`` ``t`` ``ool`` ...), and only the chat template gains the tools block.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from recipe import corpus
from recipe.config import WORK, TrainPlan
from recipe.conversation import GROUPS, TOOL_GROUPS
from recipe.template import CHAT_TEMPLATE

PLAIN = [g for g in GROUPS if g not in TOOL_GROUPS]
# The shipped pair's weights: this share of the fine-tuned ones, the rest the base's (weight-space
# ensembling, as WiSE-FT does): the rounds cost the base some of its own tasks, recall most, and a tenth of
# the base back brings them over the bar for a few tool calls (recipe/README.md, "Tools").
BLEND = 0.9


@dataclass(frozen=True)
class Round:
    """One pass of fine-tuning: its conversations (count, groups), its seed and both models' plans."""

    parts: tuple[tuple[int, tuple[str, ...]], ...]
    seed: int
    target: TrainPlan
    draft: TrainPlan


def _round(seed: int, lr: float, warmups: tuple[int, int], *parts: tuple[int, list[str]]) -> Round:
    return Round(tuple((n, tuple(g)) for n, g in parts), seed, TrainPlan(1.0, 3072, lr, warmups[0]),
                 TrainPlan(1.0, 8192, lr, warmups[1]))


ROUNDS = (
    _round(1234, 1e-3, (30, 20), (4_000, TOOL_GROUPS), (8_000, PLAIN)),
    _round(99, 2e-4, (20, 10), (1_200, TOOL_GROUPS), (9_000, PLAIN)),
    _round(77, 1.5e-4, (20, 10), (1_000, TOOL_GROUPS), (6_000, PLAIN), (3_000, ["recall"]),
           (1_000, ["string", "persona"])),
    _round(55, 1.5e-4, (20, 10), (1_500, TOOL_GROUPS), (6_000, PLAIN), (3_000, ["recall"]),
           (1_000, ["string", "persona"])),
    _round(33, 1e-4, (20, 10), (1_200, TOOL_GROUPS), (4_000, PLAIN), (4_000, ["recall"]),
           (1_000, ["string", "persona"])),
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tokenizer_with_tools(source: Path, folder: Path) -> Path:
    """The base pair's tokenizer with the recipe's template (tools included), written to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return folder


def _same_without_tools(base: Path, convs: list[dict]) -> None:
    """The template with tools must write every conversation without tools as the base pair learned it."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(base))
    for c in convs:
        ours = tok.apply_chat_template(c["messages"], tokenize=False, chat_template=CHAT_TEMPLATE)
        if ours != tok.apply_chat_template(c["messages"], tokenize=False):
            raise RuntimeError(f"the template with tools writes a plain conversation differently:\n{ours!r}")


def mix(r: Round) -> list[dict]:
    """The round's conversations, from the training side of the split, shuffled."""
    convs = [c for i, (count, groups) in enumerate(r.parts)
             for c in corpus.generate(r.seed + 10 + i, count, heldout=False, groups=list(groups))]
    random.Random(r.seed).shuffle(convs)
    path = WORK / "finetune.jsonl"
    corpus.write_jsonl(convs, path)
    return corpus.read_jsonl(path)


def blend(folder: Path, base: Path, share: float = BLEND) -> None:
    """The checkpoints in ``folder`` (mini-target/, mini-draft/), rewritten as ``share`` of each of their
    weights plus the rest of the same weight in ``base``."""
    from safetensors.numpy import load_file, save_file

    for name in ("mini-target", "mini-draft"):
        path = folder / name / "model.safetensors"
        tuned, start = load_file(path), load_file(base / name / "model.safetensors")
        if tuned.keys() != start.keys():
            raise RuntimeError(f"{name}: the base pair's weights are not the fine-tuned pair's")
        save_file({k: (share * v + (1 - share) * start[k]).astype(v.dtype) for k, v in tuned.items()}, path,
                  metadata={"format": "pt"})


def finetune(base: Path, device: str = "cpu", first: int = 1, original: Path | None = None) -> None:
    """The pair in ``base`` (an exported folder of mini-target and mini-draft), fine-tuned round by round,
    then blended with ``original`` (default: ``base``), into recipe/work/hf/ (then ``python -m recipe
    export``). ``first`` resumes: the rounds before it are taken as done, ``base`` holding the pair they
    made and ``original`` the pair they started from."""
    if not 1 <= first <= len(ROUNDS):
        raise SystemExit(f"--start takes a round from 1 to {len(ROUNDS)}, not {first}")
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    from recipe.data import to_example
    from recipe.train import train

    start = time.time()
    WORK.mkdir(parents=True, exist_ok=True)
    tok_dir = tokenizer_with_tools(base / "mini-target", WORK / "tokenizer")
    tok = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    models = {name: Qwen3ForCausalLM.from_pretrained(str(base / name), torch_dtype="float32")
              for name in ("mini-target", "mini-draft")}
    for number, r in enumerate(ROUNDS[first - 1:], first):
        convs = mix(r)
        _same_without_tools(base / "mini-target", [c for c in convs if not c.get("tools")][:300])
        examples = [to_example(tok, c) for c in convs]
        tokens = sum(len(e.prompt) + len(e.reply) for e in examples)
        log(f"round {number}: {len(convs)} conversations, {tokens} tokens")
        for name, plan in (("mini-target", r.target), ("mini-draft", r.draft)):
            train(models[name], examples, plan, r.seed, WORK / f"{name}-finetune.log", device)
    for name, model in models.items():
        model.to("cpu").save_pretrained(WORK / "hf" / name)
        tok.save_pretrained(WORK / "hf" / name)
    blend(WORK / "hf", original or base)
    log(f"fine-tuned in {(time.time() - start) / 60:.1f} minutes")
