"""`python -m recipe evaluate`: accuracy, draft acceptance, sizes and decode speed of the shipped models."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from recipe import corpus
from recipe.acceptance import acceptance
from recipe.config import MODELS, SEED, WORK
from recipe.decode import decode_seconds_per_token, greedy

EVAL_SEED = SEED + 7  # a different stream from the build's held-out file, same held-out side of the split
NAMES = ("mini-target", "mini-target-4bit", "mini-draft")


def load(name: str):
    from mlx_lm import load as mlx_load

    return mlx_load(str(MODELS / name))


def visible_reply(text: str) -> str:
    """The reply after its think block, without the end-of-turn token."""
    return text.split("</think>")[-1].removesuffix("<|im_end|>").strip("\n")


def run_tasks(model, tokenizer, pairs) -> list[dict]:
    """Greedy replies to every held-out task, thinking on and off."""
    rows = []
    for pair in pairs:
        for conv in pair:
            prompt = tokenizer.apply_chat_template(conv.messages[:-1], add_generation_prompt=True,
                                                   enable_thinking=conv.thinking)
            out = greedy(model, prompt, tokenizer.eos_token_id)
            text = tokenizer.decode(out, skip_special_tokens=False)
            rows.append({"group": conv.group, "thinking": conv.thinking, "prompt": prompt, "reply": out,
                         "text": text, "expected": conv.expected, "question": conv.messages[-2]["content"],
                         "ok": visible_reply(text) == conv.expected and text.endswith("<|im_end|>")})
    return rows


def accuracy(rows: list[dict]) -> dict:
    table: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        table["overall"].append(r["ok"])
        table[f"thinking {'on' if r['thinking'] else 'off'}"].append(r["ok"])
    for r in sorted(rows, key=lambda r: r["group"]):
        table[r["group"]].append(r["ok"])
    return {k: (sum(v) / len(v), len(v)) for k, v in table.items()}


def folder_mb(name: str) -> float:
    return sum(p.stat().st_size for p in (MODELS / name).iterdir()) / 1e6


def check_unseen(pairs) -> None:
    """Fail if a held-out conversation occurs in the last build's training data."""
    path = WORK / "train.jsonl"
    if not path.exists():
        return  # the split itself (by instance key) already keeps them apart
    seen = {json.dumps(c["messages"][:-1]) for c in corpus.read_jsonl(path)}
    leaked = [c for pair in pairs for c in pair if json.dumps(c.messages[:-1]) in seen]
    if leaked:
        raise RuntimeError(f"{len(leaked)} held-out conversations occur in {path}")


def main(tasks: int) -> None:
    per_group = -(-tasks // len(corpus.GROUPS))
    pairs = corpus.heldout_pairs(EVAL_SEED, per_group)
    check_unseen(pairs)
    models = {name: load(name) for name in NAMES}
    target, tokenizer = models["mini-target"]
    rows = run_tasks(target, tokenizer, pairs)
    report = {
        "tasks": len(pairs),
        "accuracy": accuracy(rows),
        "acceptance": acceptance(models["mini-draft"][0], rows),
        "seconds_per_token": decode_seconds_per_token({n: m for n, (m, _) in models.items()}, rows[0]["prompt"]),
        "mb": {n: folder_mb(n) for n in NAMES},
        "failures": [{k: r[k] for k in ("group", "thinking", "question", "text", "expected")}
                     for r in rows if not r["ok"]],
    }
    print_report(report)
    WORK.mkdir(parents=True, exist_ok=True)
    Path(WORK / "evaluation.json").write_text(json.dumps(report, indent=2))


def print_report(report: dict) -> None:
    print(f"Held-out tasks: {report['tasks']} (each with thinking on and off), exact match of the visible reply")
    for key, (value, n) in report["accuracy"].items():
        print(f"  {key:<14} {value:6.1%}  ({n} replies)")
    print("Greedy draft acceptance against the target, on the target's held-out replies:")
    for key, value in report["acceptance"].items():
        print(f"  {key:<28} {value:6.1%}")
    per_token, mb = report["seconds_per_token"], report["mb"]
    print("Size, and decode time per token with a KV cache (fastest of interleaved runs; shared cores"
          " make it pessimistic):")
    for name in NAMES:
        print(f"  {name:<17} {mb[name]:5.1f} MB  {per_token[name] * 1e3:6.2f} ms/token  {1 / per_token[name]:6.0f} tok/s")
    ratio = per_token["mini-draft"] / per_token["mini-target"]
    print(f"  draft/target cost per token: {ratio:.2f}; assets/models total {sum(mb.values()):.1f} MB")
