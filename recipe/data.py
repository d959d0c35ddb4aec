"""Conversations -> token ids, exactly as inference sees them: the templated prompt, then the reply."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerFast


WIDTH_STEP = 32


@dataclass(frozen=True)
class Example:
    prompt: list[int]   # everything up to and including the generation prompt
    reply: list[int]    # the assistant reply the model learns, ending with <|im_end|>


def render_prompt(tok: PreTrainedTokenizerFast, messages: list[dict], thinking: bool,
                  tools: list[dict] | None = None) -> str:
    """The templated conversation (with the tools offered, if any) that asks for the next assistant reply."""
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, enable_thinking=thinking,
                                   tokenize=False)


def to_example(tok: PreTrainedTokenizerFast, conv: dict) -> Example:
    """Template the conversation and split it at the reply.

    Prompt and reply are encoded separately, because at inference the prompt is encoded
    alone and the reply is generated token by token after it.
    """
    messages, thinking, tools = conv["messages"], conv["thinking"], conv.get("tools")
    prompt = render_prompt(tok, messages[:-1], thinking, tools)
    full = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert full.startswith(prompt) and full.endswith("<|im_end|>\n"), (prompt, full)
    reply = full[len(prompt):-1]
    return Example(tok.encode(prompt, add_special_tokens=False), tok.encode(reply, add_special_tokens=False))


def batches(examples: list[Example], tokens_per_batch: int, pad_id: int, rng: np.random.Generator):
    """Yield (ids, labels) arrays of similar-length examples; labels are -100 outside replies.

    Widths are rounded up to a multiple of WIDTH_STEP and each width has a fixed row count, so
    only a few tensor shapes occur: PyTorch's CPU kernels are much slower on every new shape.
    """
    by_width: dict[int, list[int]] = {}
    for i, e in enumerate(examples):
        width = -(-(len(e.prompt) + len(e.reply)) // WIDTH_STEP) * WIDTH_STEP
        by_width.setdefault(width, []).append(i)
    groups, carry = [], []
    for width in sorted(by_width):
        rows = max(1, tokens_per_batch // width)
        pending = carry + list(rng.permutation(by_width[width]))
        full = len(pending) // rows * rows
        groups += [(width, pending[k: k + rows]) for k in range(0, full, rows)]
        carry = pending[full:]  # too few for a batch: they ride along with longer examples
    if carry:
        groups.append((max(by_width), carry))
    for g in rng.permutation(len(groups)):
        width, members = groups[g]
        yield _pad([examples[i] for i in members], width, pad_id)


def _pad(group: list[Example], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(group), width), pad_id, dtype=np.int64)
    labels = np.full((len(group), width), -100, dtype=np.int64)
    for row, e in enumerate(group):
        seq = e.prompt + e.reply
        ids[row, : len(seq)] = seq
        labels[row, len(e.prompt): len(seq)] = e.reply
    return ids, labels
