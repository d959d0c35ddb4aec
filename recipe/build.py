"""The whole retrain: corpus, tokenizer, target, draft, export."""

from __future__ import annotations

import json
import time
from pathlib import Path

from recipe import corpus
from recipe.config import (DFLASH, DFLASH_BLOCK, DFLASH_MASK_ID, DFLASH_TARGET_LAYERS, DRAFT, MODELS, SEED, TARGET,
                           VOCAB_SIZE, WORK, Budget, DraftPlan)
from recipe.template import render
from recipe.tokenizer import save_tokenizer, train_tokenizer


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def make_corpus(budget: Budget) -> tuple[list[dict], list[dict]]:
    """Write train.jsonl and heldout.jsonl; prove no held-out prompt occurs in training."""
    train = corpus.generate(SEED, budget.train_conversations, heldout=False)
    heldout = corpus.generate(SEED + 1, budget.heldout_conversations, heldout=True)
    corpus.write_jsonl(train, WORK / "train.jsonl")
    corpus.write_jsonl(heldout, WORK / "heldout.jsonl")
    seen = {json.dumps(c.messages[:-1]) for c in train}
    leaked = sum(json.dumps(c.messages[:-1]) in seen for c in heldout)
    if leaked:
        raise RuntimeError(f"{leaked} held-out conversations also occur in the training data")
    return corpus.read_jsonl(WORK / "train.jsonl"), corpus.read_jsonl(WORK / "heldout.jsonl")


def make_tokenizer(train: list[dict]) -> Path:
    texts = [render(c["messages"], c.get("tools")) for c in train]
    folder = WORK / "tokenizer"
    save_tokenizer(train_tokenizer(texts, VOCAB_SIZE), folder)
    return folder


def build(budget: Budget, device: str = "cpu", export_models: bool = True) -> None:
    """Corpus, tokenizer, target, draft (checkpoints under recipe/work/hf/), then the MLX export."""
    # Imported here so that corpus and tokenizer steps need no torch.
    from transformers import PreTrainedTokenizerFast

    from recipe.data import to_example
    from recipe.train import new_model, train

    start = time.time()
    WORK.mkdir(parents=True, exist_ok=True)
    train_convs, _ = make_corpus(budget)
    log(f"corpus: {len(train_convs)} training conversations")
    tok_dir = make_tokenizer(train_convs)
    tok = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    examples = [to_example(tok, c) for c in train_convs]
    log(f"tokens: {sum(len(e.prompt) + len(e.reply) for e in examples)}")
    # The draft learns the same replies as the target; distilling it from the target's
    # distributions was tried and did not raise greedy acceptance, so it is not done.
    for name, shape, plan in (("mini-target", TARGET, budget.target), ("mini-draft", DRAFT, budget.draft)):
        model = new_model(shape, SEED)
        log(f"training {name}: {sum(p.numel() for p in model.parameters())} parameters")
        train(model, examples, plan, SEED, WORK / f"{name}.log", device)
        model.to("cpu").save_pretrained(WORK / "hf" / name)
        tok.save_pretrained(WORK / "hf" / name)
    log(f"trained in {(time.time() - start) / 60:.1f} minutes")
    if export_models:
        export_all()
        log(f"done in {(time.time() - start) / 60:.1f} minutes")


def export_all(folder: Path = MODELS) -> None:
    """recipe/work/hf/ checkpoints -> ``folder`` (assets/models/ by default; mlx-lm's converter, no torch)."""
    from recipe.export import export

    hf, tok_dir = WORK / "hf", WORK / "tokenizer"
    log(f"exporting to {folder}")
    export(hf / "mini-target", folder / "mini-target", tok_dir)
    export(hf / "mini-draft", folder / "mini-draft", tok_dir)
    export(hf / "mini-target", folder / "mini-target-4bit", tok_dir, quantize=True)


def build_dflash(plan: DraftPlan, export_model: bool = True, folder: Path = MODELS, prompts: int = 120,
                 resume: int = 0) -> dict:
    """Train the DFlash block drafter against the shipped mini-target, export it to ``folder``/mini-dflash and
    measure its accepted length against the mini-draft's (written to recipe/work/dflash.json).

    ``resume`` = n > 0: continue from the drafter already in ``folder``/mini-dflash, on the conversations of
    seed SEED + 1 + n (new ones each time).
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    from recipe.data import to_example
    from recipe.dflash import DFlashDrafter, DFlashSpec, load, save, start_from_target
    from recipe.dflash_train import train_drafter

    start = time.time()
    WORK.mkdir(parents=True, exist_ok=True)
    target = Qwen3ForCausalLM.from_pretrained(str(MODELS / "mini-target"), dtype=torch.float32).eval()
    tok = PreTrainedTokenizerFast.from_pretrained(str(MODELS / "mini-target"))
    convs = corpus.generate(SEED + 1 + resume if resume else SEED, plan.conversations, heldout=False)
    examples = [to_example(tok, json.loads(c.to_json())) for c in convs]
    spec = DFlashSpec(DFLASH, DFLASH_BLOCK, DFLASH_TARGET_LAYERS, DFLASH_MASK_ID)
    if resume:
        drafter = load(folder / "mini-dflash").train()
    else:
        drafter = DFlashDrafter(spec, SEED)
        start_from_target(drafter, target)
    log(f"training mini-dflash: {sum(p.numel() for p in drafter.parameters())} parameters, "
        f"{len(examples)} conversations")
    loss = train_drafter(drafter, target, examples, plan, SEED, WORK / "mini-dflash.log")
    log(f"trained in {(time.time() - start) / 60:.1f} minutes, final loss {loss:.3f}")
    out = folder / "mini-dflash" if export_model else WORK / "hf" / "mini-dflash"
    save(drafter, out)
    from recipe.dflash_eval import measure

    report = {"train minutes": round((time.time() - start) / 60, 1), "final loss": loss,
              **measure(load(out), MODELS, prompts)}  # measured as exported (bfloat16 weights)
    (WORK / "dflash.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"exported to {out}; accepted length {json.dumps(report)}")
    return report
