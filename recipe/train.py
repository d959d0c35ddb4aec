"""Train a Qwen3-architecture model with transformers + PyTorch on the CPU."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from recipe.config import ModelShape, TrainPlan
from recipe.data import Example, batches


def new_model(shape: ModelShape, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**shape.hf_config()))


def _optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    # No weight decay on norms (1-d weights): it would only pull their gains towards zero.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def _lr_at(step: int, total: int, plan: TrainPlan) -> float:
    if step < plan.warmup:
        return plan.lr * (step + 1) / plan.warmup
    progress = (step - plan.warmup) / max(1, total - plan.warmup)
    return plan.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _steps(examples: list[Example], plan: TrainPlan, seed: int):
    """The batches of all epochs, in a seeded order (a fractional last epoch is cut short)."""
    rng = np.random.default_rng(seed)
    per_epoch = list(batches(examples, plan.tokens_per_batch, 0, rng))
    out = []
    for _ in range(math.ceil(plan.epochs)):
        order = rng.permutation(len(per_epoch))
        out += [per_epoch[i] for i in order]
    return out[: int(len(per_epoch) * plan.epochs)]


def train(model: Qwen3ForCausalLM, examples: list[Example], plan: TrainPlan, seed: int, log: Path,
          device: str = "cpu") -> None:
    """Train on the reply tokens (next-token cross-entropy), logging the loss to ``log``."""
    torch.set_num_threads(2)  # the machine the recipe targets has two cores
    model.to(device)
    steps = _steps(examples, plan, seed)
    opt = _optimizer(model, plan.lr)
    model.train()
    start = time.time()
    with log.open("a") as f:
        for step, (ids, labels) in enumerate(steps):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, len(steps), plan)
            loss = _loss(model, torch.from_numpy(ids).to(device), torch.from_numpy(labels).to(device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 20 == 0 or step == len(steps) - 1:
                f.write(f"step {step}/{len(steps)} loss {loss.item():.4f} {time.time() - start:.0f}s\n")
                f.flush()
    model.eval()


def _loss(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    target = labels[:, 1:]                                # (B, T-1)
    mask = target != -100
    # The output head runs on reply positions only: the same loss, without logits nobody learns from.
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1][mask]
    return torch.nn.functional.cross_entropy(model.lm_head(hidden), target[mask])
