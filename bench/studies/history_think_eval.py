"""Do answers get worse when earlier non-thinking replies keep their empty think block in history?

Usage: .venv/bin/python bench/studies/history_think_eval.py [PER_GROUP]
On the embedded target's held-out conversations (recipe/corpus.py, the same tasks
`python -m recipe evaluate` uses) that have earlier assistant turns, greedy replies
are scored by exact match twice: history rendered as the template does (earlier
replies without their block), and as mlxchat renders it now (mlxcore/think_blocks.py:
earlier replies written with thinking off keep ``<think>\\n\\n</think>\\n\\n``).
Prints both accuracies per thinking mode, and how many replies changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the recipe package is not installed

import mlxcore  # noqa: E402,F401  (loads OpenBLAS before MLX)
from mlx_lm import load  # noqa: E402

from assets import MODELS_DIR  # noqa: E402
from mlxcore.chat_template import render_chat  # noqa: E402
from recipe import corpus  # noqa: E402
from recipe.decode import greedy  # noqa: E402
from recipe.evaluate import EVAL_SEED, visible_reply  # noqa: E402


def main(per_group: int) -> None:
    model, tokenizer = load(str(MODELS_DIR / "mini-target"))
    pairs = corpus.heldout_pairs(EVAL_SEED, per_group)
    rows = {True: [], False: []}  # thinking -> [(ok before, ok after)]
    for pair in pairs:
        for conv in pair:
            history = conv.messages[:-1]
            if not any(m["role"] == "assistant" for m in history):
                continue
            before = tokenizer.apply_chat_template(history, add_generation_prompt=True,
                                                   enable_thinking=conv.thinking)
            after = render_chat(tokenizer, history, enable_thinking=conv.thinking)
            rows[conv.thinking].append(tuple(_ok(model, tokenizer, prompt, conv.expected)
                                             for prompt in (before, after)))
    for thinking, results in rows.items():
        n = len(results)
        before, after = sum(r[0] for r in results), sum(r[1] for r in results)
        changed = sum(r[0] != r[1] for r in results)
        print(f"thinking {'on ' if thinking else 'off'}: {n} multi-turn conversations; exact match "
              f"{before}/{n} ({before / n:.1%}) as the template renders history, {after}/{n} ({after / n:.1%}) "
              f"with the empty blocks kept; {changed} replies changed")


def _ok(model, tokenizer, prompt: list[int], expected: str) -> bool:
    text = tokenizer.decode(greedy(model, prompt, tokenizer.eos_token_id), skip_special_tokens=False)
    return visible_reply(text) == expected and text.endswith("<|im_end|>")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
