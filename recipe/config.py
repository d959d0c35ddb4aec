"""Sizes, seeds and paths of the recipe: one place to read what gets built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "recipe" / "work"          # intermediate outputs (git-ignored)
MODELS = ROOT / "assets" / "models"       # exported models that ship with mlxchat
SEED = 1234
VOCAB_SIZE = 2048


@dataclass(frozen=True)
class ModelShape:
    """A Qwen3 model's geometry (the fields of its config.json)."""

    layers: int        # transformer blocks
    hidden: int        # residual width
    heads: int         # query heads
    kv_heads: int      # key/value heads (grouped-query attention)
    head_dim: int      # width of one head
    intermediate: int  # MLP width

    def hf_config(self) -> dict:
        return dict(vocab_size=VOCAB_SIZE, hidden_size=self.hidden, intermediate_size=self.intermediate,
                    num_hidden_layers=self.layers, num_attention_heads=self.heads,
                    num_key_value_heads=self.kv_heads, head_dim=self.head_dim, tie_word_embeddings=True,
                    max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
                    bos_token_id=None, eos_token_id=2, pad_token_id=0)


@dataclass(frozen=True)
class TrainPlan:
    """How one model is trained."""

    epochs: float           # passes over the training conversations
    tokens_per_batch: int   # padded tokens per optimizer step
    lr: float               # peak learning rate (linear warm-up, cosine decay to 10%)
    warmup: int             # warm-up steps


# Decode cost on a CPU is set mostly by the number of layers (per-op overhead), training cost by
# the parameter count: a deep, narrow target and a one-layer draft keep the draft's per-token
# cost far below a quarter of the target's while the target stays cheap to train.
TARGET = ModelShape(layers=6, hidden=192, heads=6, kv_heads=2, head_dim=32, intermediate=576)
DRAFT = ModelShape(layers=1, hidden=192, heads=6, kv_heads=2, head_dim=32, intermediate=512)


@dataclass(frozen=True)
class Budget:
    """Corpus sizes and training plans of one build."""

    train_conversations: int
    heldout_conversations: int
    target: TrainPlan
    draft: TrainPlan


FULL = Budget(60_000, 800, TrainPlan(2.0, 3072, 3e-3, 60), TrainPlan(1.0, 8192, 3e-3, 40))
QUICK = Budget(12_000, 400, TrainPlan(1.0, 3072, 3e-3, 30), TrainPlan(1.0, 8192, 3e-3, 20))


@dataclass(frozen=True)
class DraftPlan:
    """How the DFlash block drafter is trained (recipe/dflash_train.py)."""

    conversations: int      # training conversations (their prompts and the target's greedy replies)
    epochs: float           # passes over them (each pass draws new anchors)
    tokens_per_batch: int   # padded context tokens per optimizer step
    anchors: int            # blocks drawn per conversation and step
    lr: float               # peak learning rate (linear warm-up, cosine decay to 10%)
    warmup: int             # warm-up steps
    gamma: float            # position weights exp(-(k-1)/gamma) (the DFlash paper's 4 for blocks of 8)


# The block drafter: two layers of the target's width; blocks of 8 (mlxchat drafts 4-6 of them); context from
# target layers 1, 3 and 4 of 0-5 (early, middle and the last but one: the last one's output is read after the
# final norm by transformers and before it by a layer hook, so it is left out); masks are <|endoftext|> (id 0),
# the pad token, which never occurs in a chat (the tokenizer has no unused token; its vocabulary stays as is).
DFLASH = ModelShape(layers=2, hidden=192, heads=6, kv_heads=2, head_dim=32, intermediate=576)
DFLASH_BLOCK = 8
DFLASH_TARGET_LAYERS = (1, 3, 4)
DFLASH_MASK_ID = 0
DFLASH_FULL = DraftPlan(9_000, 1.0, 4096, 12, 2e-3, 20, 4.0)
DFLASH_MORE = DraftPlan(5_000, 1.0, 4096, 12, 1e-3, 10, 4.0)   # --resume: a second stage on new conversations
DFLASH_QUICK = DraftPlan(600, 1.0, 4096, 12, 2e-3, 5, 4.0)
