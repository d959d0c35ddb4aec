"""Accepted length per block of the DFlash drafter against the mini-draft's, under greedy verification.

The target's greedy replies to held-out prompts are made once (MLX, as mlxchat decodes). At temperature 0
the drafter is only ever asked at positions on that reply, so every round of speculative decoding can be
replayed from teacher-forced passes: the block drafter guesses a block at every reply position in one
batched pass (PyTorch), the mini-draft its next token at every position. A round starting at position a
accepts the leading guesses equal to the reply, then the target adds its own token: accepted length =
matches + 1, as z-lab's ``acceptance_lengths`` count it. Rounds walk the reply as a decode would.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from recipe import corpus
from recipe.config import MODELS, SEED
from recipe.data import to_example
from recipe.dflash import DFlashDrafter, context_features
from recipe.dflash_train import guesses, layout

EVAL_SEED = SEED + 11   # held-out side of the split, a stream of its own
SIZES = (4, 6, 8)       # block sizes measured (the mini-draft drafts one fewer per round)


def walk(matches: list[int], length: int) -> list[int]:
    """Accepted lengths of the rounds over a reply of ``length`` tokens; matches[i]: guesses right from token i."""
    out, i = [], 0
    while i < length - 1:       # the reply's first token comes from the prompt's pass, not a round
        n = min(matches[i], length - 1 - i)
        out.append(min(n + 1, length - 1 - i))  # no token of the target's own after the reply's last
        i += n + 1
    return out


def leading(guess: torch.Tensor, truth: torch.Tensor) -> list[int]:
    """Per row, how many leading guesses equal the truth (-100 in truth never matches)."""
    return (guess == truth).int().cumprod(1).sum(1).tolist()


def block_matches(drafter: DFlashDrafter, target, rows: list[tuple[list[int], int]], block_size: int,
                  feats: torch.Tensor) -> list[list[int]]:
    """Per row, for each reply position i (token start + i as the anchor): the block drafter's leading right guesses.

    rows: (prompt + reply, prompt length), padded into one batch; feats: the target's context features of it.
    """
    ids = padded(rows)
    starts = torch.tensor([start for _, start in rows])
    width = max(len(seq) - start for seq, start in rows)
    ends = torch.tensor([len(seq) for seq, _ in rows])
    anchor = torch.minimum(starts[:, None] + torch.arange(width), ends[:, None] - 1)
    with torch.inference_mode():
        block_ids, block_pos, goal, mask = layout(ids, anchor, ends, drafter.spec.mask_token_id, block_size)
        h = guesses(drafter, target, feats, ids, block_ids, block_pos, mask)
        guess = target.lm_head(h.view(len(rows), width, block_size, -1)[:, :, 1:]).argmax(-1)
    return [leading(guess[r], goal[r])[: len(seq) - start] for r, (seq, start) in enumerate(rows)]


def draft_matches(hits: list[bool], k: int) -> list[int]:
    """The same for a draft model drafting k tokens (hits[i]: it guesses reply token i + 1 on the true prefix)."""
    out = []
    for i in range(len(hits) + 1):
        n = 0
        while n < k and i + n < len(hits) and hits[i + n]:
            n += 1
        out.append(n)
    return out


def padded(rows: list[tuple[list[int], int]]) -> torch.Tensor:
    ids = torch.zeros(len(rows), max(len(seq) for seq, _ in rows), dtype=torch.long)
    for r, (seq, _) in enumerate(rows):
        ids[r, : len(seq)] = torch.tensor(seq)
    return ids


def replies(models: Path, count: int) -> list[tuple[list[int], int]]:
    """(prompt + greedy reply, prompt length) for ``count`` held-out conversations, decoded by MLX."""
    from mlx_lm import load as mlx_load
    from transformers import PreTrainedTokenizerFast

    from recipe.decode import greedy

    model, _ = mlx_load(str(models / "mini-target"))
    tok = PreTrainedTokenizerFast.from_pretrained(str(models / "mini-target"))
    out = []
    for conv in corpus.generate(EVAL_SEED, count, heldout=True):
        prompt = to_example(tok, json.loads(conv.to_json())).prompt
        out.append((prompt + greedy(model, prompt, tok.eos_token_id), len(prompt)))
    return out


def measure(drafter: DFlashDrafter, models: Path = MODELS, count: int = 120) -> dict:
    """Mean accepted length per round for each block size, block drafter and mini-draft."""
    from transformers import Qwen3ForCausalLM

    torch.set_num_threads(2)
    target = Qwen3ForCausalLM.from_pretrained(str(models / "mini-target"), dtype=torch.float32).eval()
    draft = Qwen3ForCausalLM.from_pretrained(str(models / "mini-draft"), dtype=torch.float32).eval()
    rows = sorted(replies(models, count), key=lambda r: len(r[0]))
    report: dict = {"prompts": len(rows), "reply tokens": sum(len(s) - p for s, p in rows)}
    ours: dict[int, list[int]] = {size: [] for size in SIZES}
    theirs: dict[int, list[int]] = {size: [] for size in SIZES}
    for k in range(0, len(rows), 8):
        batch = rows[k: k + 8]
        ids = padded(batch)
        with torch.inference_mode():
            feats = context_features(target(input_ids=ids, output_hidden_states=True).hidden_states,
                                     drafter.spec.target_layer_ids)
            draft_says = draft(input_ids=ids).logits.argmax(-1)
        for size in SIZES:
            for (seq, start), matches in zip(batch, block_matches(drafter, target, batch, size, feats)):
                ours[size] += walk(matches, len(seq) - start)
        for r, (seq, start) in enumerate(batch):
            hits = (draft_says[r, start: len(seq) - 1] == torch.tensor(seq[start + 1:])).tolist()
            for size in SIZES:
                theirs[size] += walk(draft_matches(hits, size - 1), len(seq) - start)
    for size in SIZES:
        report[f"block {size}"] = {"dflash": sum(ours[size]) / len(ours[size]),
                                   "mini-draft": sum(theirs[size]) / len(theirs[size]), "rounds": len(ours[size])}
    return report


def decode(drafter: DFlashDrafter, target, prompt: list[int], block_size: int, eos: int,
           max_tokens: int = 64) -> tuple[list[int], list[int]]:
    """Speculative greedy decoding as z-lab's ``dflash_generate`` does it, without caches: (reply, accepted lengths).

    Each round recomputes everything (slow, plain): the target's hidden states of the tokens so far give the
    context; the block [last token, masks...] sits at the next positions and sees all of it; the target checks
    the block in one pass and adds its own token. The replay in ``measure`` must agree with this.
    """
    with torch.inference_mode():
        seq = prompt + [int(target(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())]
        lengths: list[int] = []
        while seq[-1] != eos and len(seq) - len(prompt) < max_tokens:
            start = len(seq) - 1                     # the last token has no hidden state yet
            feats = context_features(target(input_ids=torch.tensor([seq[:start]]), output_hidden_states=True
                                            ).hidden_states, drafter.spec.target_layer_ids)
            block = torch.tensor([[seq[-1]] + [drafter.spec.mask_token_id] * (block_size - 1)])
            pos = torch.arange(start, start + block_size)[None]
            mask = torch.ones(1, 1, block_size, start + block_size, dtype=torch.bool)
            h = guesses(drafter, target, feats, torch.tensor([seq[:start]]), block, pos, mask)
            drafted = target.lm_head(h[:, 1:]).argmax(-1)[0].tolist()
            checked = target(input_ids=torch.tensor([seq + drafted])).logits[0, start:].argmax(-1).tolist()
            n = next((i for i, (d, c) in enumerate(zip(drafted, checked)) if d != c), len(drafted))
            new = drafted[:n] + [checked[n]]
            if eos in new:
                new = new[: new.index(eos) + 1]
            seq += new
            lengths.append(len(new))
    return seq[len(prompt):], lengths
