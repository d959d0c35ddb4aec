"""`python -m recipe evaluate`: accuracy, tool use, draft acceptance, sizes and decode speed of the models."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from recipe import corpus
from recipe.acceptance import acceptance
from recipe.config import MODELS, SEED, WORK
from recipe.decode import decode_seconds_per_token, greedy
from recipe.tool_eval import tool_report

EVAL_SEED = SEED + 7  # a different stream from the build's held-out file, same held-out side of the split
NAMES = ("mini-target", "mini-target-4bit", "mini-draft")


def load(folder: Path):
    from mlx_lm import load as mlx_load

    return mlx_load(str(folder))


def visible_reply(text: str) -> str:
    """The reply after its think block, without the end-of-turn token."""
    return text.split("</think>")[-1].removesuffix("<|im_end|>").strip("\n")


def run_tasks(model, tokenizer, convs) -> list[dict]:
    """Greedy replies to every held-out conversation (with its tools, if offered)."""
    rows = []
    for conv in convs:
        prompt = tokenizer.apply_chat_template(conv.messages[:-1], tools=conv.tools, add_generation_prompt=True,
                                               enable_thinking=conv.thinking)
        out = greedy(model, prompt, tokenizer.eos_token_id)
        text = tokenizer.decode(out, skip_special_tokens=False)
        question = [m["content"] for m in conv.messages if m["role"] == "user"][-1]
        rows.append({"group": conv.group, "thinking": conv.thinking, "prompt": prompt, "reply": out,
                     "text": text, "expected": conv.expected, "question": question,
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


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir()) / 1e6


def check_unseen(pairs) -> None:
    """Fail if a held-out conversation occurs in the last build's training data."""
    path = WORK / "train.jsonl"
    if not path.exists():
        return  # the split itself (by instance key) already keeps them apart
    seen = {json.dumps(c["messages"][:-1]) for c in corpus.read_jsonl(path)}
    leaked = [c for pair in pairs for c in pair if json.dumps(c.messages[:-1]) in seen]
    if leaked:
        raise RuntimeError(f"{len(leaked)} held-out conversations occur in {path}")


def main(tasks: int, folder: Path = MODELS) -> None:
    """Evaluate the three models in ``folder``; the report goes to recipe/work/evaluation.json too."""
    per_group = -(-tasks // len(corpus.GROUPS))
    pairs = corpus.heldout_pairs(EVAL_SEED, per_group)
    check_unseen(pairs)
    convs = [conv for pair in pairs for conv in pair]
    models = {name: load(folder / name) for name in NAMES}
    target, tokenizer = models["mini-target"]
    rows = run_tasks(target, tokenizer, convs)
    tool = tool_report(target, tokenizer, rows, convs)
    report = {
        "models": str(folder),
        "tasks": len(pairs),
        "accuracy": accuracy(rows),
        "tools": tool["rates"],
        "acceptance": acceptance(models["mini-draft"][0], rows),
        "seconds_per_token": decode_seconds_per_token({n: m for n, (m, _) in models.items()}, rows[0]["prompt"]),
        "mb": {n: folder_mb(folder / n) for n in NAMES},
        "failures": [{k: r[k] for k in ("group", "thinking", "question", "text", "expected")}
                     for r in rows if not r["ok"]],
        "tool failures": tool["failures"],
    }
    print_report(report)
    WORK.mkdir(parents=True, exist_ok=True)
    Path(WORK / "evaluation.json").write_text(json.dumps(report, indent=2))


def print_report(report: dict) -> None:
    print(f"Held-out tasks: {report['tasks']} (each with thinking on and off), exact match of the visible reply")
    for key, (value, n) in report["accuracy"].items():
        print(f"  {key:<14} {value:6.1%}  ({n} replies)")
    print("Tool use on held-out phrasings: the call (name and arguments, read by mlxchat's parser), then the"
          " answer to the tool's result:")
    for key, (value, n) in report["tools"].items():
        print(f"  {key:<36} {value:6.1%}  ({n})")
    print("Greedy draft acceptance against the target, on the target's held-out replies:")
    for key, value in report["acceptance"].items():
        print(f"  {key:<28} {value:6.1%}")
    per_token, mb = report["seconds_per_token"], report["mb"]
    print("Size, and decode time per token with a KV cache (fastest of interleaved runs; shared cores"
          " make it pessimistic):")
    for name in NAMES:
        print(f"  {name:<17} {mb[name]:5.1f} MB  {per_token[name] * 1e3:6.2f} ms/token  {1 / per_token[name]:6.0f} tok/s")
    ratio = per_token["mini-draft"] / per_token["mini-target"]
    print(f"  draft/target cost per token: {ratio:.2f}; {report['models']} total {sum(mb.values()):.1f} MB")
