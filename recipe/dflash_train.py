"""Train the DFlash block drafter against the frozen mini-target, as the DFlash paper describes.

Data: the target's own greedy replies. Each training reply is verified by the target in the teacher-forced
pass that also gives the drafter its context (the corpus reply acts as a draft), and cut after the first token where the target would have written
something else, that token replaced by the target's own: what is left is exactly a prefix of the target's
greedy reply to that prompt (about 9 replies in 10 are whole), without generating token by token. The drafter
is measured by how much of the target's greedy continuation it guesses, so that is what it learns.

Objective: random anchor positions in those replies; the block starting at an anchor holds the anchor token
then masks; the drafter sees the target's hidden states of every token before the anchor and predicts the
tokens at the masked positions, with cross-entropy weighted exp(-(k-1)/gamma) by position k in the block
(early tokens decide the accepted length). Many blocks of one conversation train at once under one mask.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from recipe.config import DraftPlan
from recipe.data import Example, batches
from recipe.dflash import DFlashDrafter, DFlashSpec, context_features
from recipe.train import _lr_at, _optimizer


def greedy_labels(ids: torch.Tensor, labels: torch.Tensor, predicted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut each reply where the target's greedy token first differs from it, that token replaced by the target's.

    ids, labels: (B, T), labels -100 outside the reply; predicted: (B, T), the target's argmax after each
    position. What is left of each reply is a prefix of the target's own greedy reply to its prompt.
    """
    in_reply = labels != -100
    wrong = in_reply & (ids != predicted.roll(1, 1))       # the reply token at p against the guess made at p - 1
    cut = torch.where(wrong.any(1), wrong.int().argmax(1), torch.full_like(wrong[:, 0], ids.shape[1], dtype=torch.long))
    keep = in_reply & (torch.arange(ids.shape[1]) <= cut[:, None])
    fixed = torch.where(torch.arange(ids.shape[1]) == cut[:, None], predicted.roll(1, 1), ids)
    return fixed, torch.where(keep, fixed, torch.full_like(fixed, -100))


def layout(ids: torch.Tensor, anchor: torch.Tensor, end: torch.Tensor, mask_token_id: int, block_size: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks starting at ``anchor`` (B, A) in ``ids`` (B, T), each row's tokens ending before ``end`` (B,).

    Returns block token ids and positions (B, A * bs), the tokens to guess (B, A, bs - 1), -100 past ``end``,
    and the attention mask (B, 1, A * bs, T + A * bs): a block row sees the context before its anchor and
    every row of its own block (z-lab's non-causal block).
    """
    b, t = ids.shape
    a = anchor.shape[1]
    j = torch.arange(block_size)
    pos = anchor[..., None] + j                            # (B, A, bs)
    gathered = ids.gather(1, pos.clamp(max=t - 1).view(b, -1)).view(b, a, block_size)
    block_ids = torch.where(j == 0, gathered, torch.full_like(gathered, mask_token_id))
    goal = torch.where(pos < end[:, None, None], gathered, torch.full_like(gathered, -100))[..., 1:]
    own = torch.arange(a).repeat_interleave(block_size)    # which block each row belongs to
    sees_ctx = torch.arange(t)[None, None, :] < anchor.repeat_interleave(block_size, 1)[..., None]
    sees_block = (own[:, None] == own[None, :]).expand(b, -1, -1)
    mask = torch.cat([sees_ctx, sees_block], 2)[:, None]
    return block_ids.view(b, -1), pos.view(b, -1), goal, mask


def blocks(ids: torch.Tensor, labels: torch.Tensor, spec: DFlashSpec, anchors: int,
           gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``anchors`` random blocks in each row's reply (labels -100 outside it), laid out by ``layout``."""
    b, t = ids.shape
    in_reply = labels != -100
    first = in_reply.int().argmax(1)                       # the reply's first position (B,)
    end = t - in_reply.flip(1).int().argmax(1)             # one past its last (B,)
    # Anchors are uniform over [first, end - 2]: each has at least one token to guess.
    span = (end - 1 - first).clamp(min=1).float()
    anchor = first[:, None] + (torch.rand(b, anchors, generator=gen) * span[:, None]).long()
    return layout(ids, anchor, end, spec.mask_token_id, spec.block_size)


def guesses(drafter: DFlashDrafter, target, feats: torch.Tensor, ids: torch.Tensor, block_ids: torch.Tensor,
            block_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The drafter's output hidden states for laid-out blocks (feats: the target's context features of ids)."""
    ctx_pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    return drafter(target.model.embed_tokens(block_ids), block_pos, feats, ctx_pos, mask)


def block_loss(drafter: DFlashDrafter, target, ids: torch.Tensor, labels: torch.Tensor, anchors: int,
               gamma: float, gen: torch.Generator) -> torch.Tensor:
    """Position-weighted cross-entropy of the drafter's guesses at the masked positions of random blocks."""
    spec = drafter.spec
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        feats = context_features(out.hidden_states, spec.target_layer_ids)
        ids, labels = greedy_labels(ids, labels, out.logits.argmax(-1))
    block_ids, block_pos, goal, mask = blocks(ids, labels, spec, anchors, gen)
    h = guesses(drafter, target, feats, ids, block_ids, block_pos, mask)
    b, bs = ids.shape[0], spec.block_size
    h = h.view(b, anchors, bs, -1)[:, :, 1:]               # the masked positions
    keep = goal != -100
    if not keep.any():
        return h.sum() * 0.0
    weight = torch.exp(-torch.arange(bs - 1, dtype=torch.float32) / gamma).expand_as(goal)[keep]
    ce = F.cross_entropy(target.lm_head(h[keep]), goal[keep], reduction="none")
    return (ce * weight).sum() / weight.sum()


def train_drafter(drafter: DFlashDrafter, target, examples: list[Example], plan: DraftPlan, seed: int,
                  log: Path) -> float:
    """Train ``drafter`` on ``examples`` against the frozen ``target``; returns the mean loss of the last 20 steps."""
    torch.set_num_threads(2)
    for p in target.parameters():
        p.requires_grad_(False)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    steps, passes = [], -(-plan.epochs // 1)
    for _ in range(int(passes)):
        steps += list(batches(examples, plan.tokens_per_batch, 0, rng))
    steps = steps[: max(1, int(len(steps) / passes * plan.epochs))]
    schedule = _Schedule(plan, len(steps))
    opt = _optimizer(drafter, plan.lr)
    drafter.train()
    start, recent = time.time(), []
    with log.open("a") as f:
        for step, (ids, labels) in enumerate(steps):
            for group in opt.param_groups:
                group["lr"] = schedule.lr(step)
            loss = block_loss(drafter, target, torch.from_numpy(ids), torch.from_numpy(labels), plan.anchors,
                              plan.gamma, gen)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            recent = (recent + [loss.item()])[-20:]
            if step % 20 == 0 or step == len(steps) - 1:
                f.write(f"step {step}/{len(steps)} loss {loss.item():.4f} {time.time() - start:.0f}s\n")
                f.flush()
    drafter.eval()
    return sum(recent) / len(recent)


class _Schedule:
    """The target's schedule (warm-up, cosine to 10%) for the drafter's plan."""

    def __init__(self, plan: DraftPlan, total: int) -> None:
        from recipe.config import TrainPlan

        self.plan, self.total = TrainPlan(plan.epochs, plan.tokens_per_batch, plan.lr, plan.warmup), total

    def lr(self, step: int) -> float:
        return _lr_at(step, self.total, self.plan)
