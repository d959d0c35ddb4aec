"""A block drafter in DFlash's published layout (z-lab's ``*-DFlash-*`` folders), read and run here.

A block drafter proposes a whole block in one pass: the block is [y, m, m, ..., m] (y the reply's last
token, m the folder's mask token) at the positions right after the tokens the target has read, and each
mask position's output is a draft token. Its few Qwen3-style layers attend, without a causal mask, over
the block and over a **context**: the target's hidden states at the layers ``target_layer_ids`` names,
projected by ``fc`` and normed by ``hidden_norm``, one row per token the target read. Each layer's keys and
values of the context are computed once, when the target has read the token (``BlockContext``). The
drafter borrows the target's ``embed_tokens`` and ``lm_head`` (after its own final ``norm``).

A folder is ``config.json`` (Qwen3's layer fields, plus ``block_size``, ``num_target_layers`` and
``dflash_config`` {``target_layer_ids``, ``mask_token_id``}, also accepted at the top level) and
``*.safetensors`` whose names ``BlockDraftModel`` gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.qwen3 import MLP

from mlxcore.compile_support import compile_works
from mlxcore.compiled_forward import has_split_layers
from mlxcore.device_profile import current
from mlxcore.errors import ModelLoadError
from mlxcore.fingerprint import read_config
from mlxcore.kv.geometry import activation_dtype

if TYPE_CHECKING:
    from mlxcore.kv.budget import KVBudget


@dataclass(frozen=True)
class BlockDrafterConfig:
    hidden_size: int  # must be the target's: the drafter reads its hidden states and borrows its head
    num_hidden_layers: int  # the drafter's own layers (a few)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # must be the target's (its embedding and head are the target's)
    rms_norm_eps: float
    rope_theta: float
    block_size: int  # the block it was trained on: the most positions a pass proposes, plus one
    target_layer_ids: tuple[int, ...]  # the target layers whose outputs make its context, in this order
    mask_token_id: int  # the token that fills the block after y

    @classmethod
    def read(cls, folder: Path) -> BlockDrafterConfig:
        """The config of a block-drafter folder (``ModelLoadError`` in one line when it is not one)."""
        raw = read_config(folder)
        if not is_block_drafter(raw):
            raise ModelLoadError(f"{folder} is not a block drafter (no block_size and target_layer_ids in "
                                 "config.json).")
        extra = {**raw, **(raw.get("dflash_config") or {})}
        rope = raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta") or 1_000_000.0
        try:
            return cls(int(raw["hidden_size"]), int(raw["num_hidden_layers"]), int(raw["num_attention_heads"]),
                       int(raw["num_key_value_heads"]),
                       int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]),
                       int(raw["intermediate_size"]), int(raw["vocab_size"]), float(raw.get("rms_norm_eps", 1e-6)),
                       float(rope), int(raw["block_size"]), tuple(int(i) for i in extra["target_layer_ids"]),
                       int(extra.get("mask_token_id") or 0))
        except (KeyError, TypeError, ValueError) as error:
            raise ModelLoadError(f"{folder / 'config.json'} does not describe a block drafter "
                                 f"(missing or bad {error}).") from None


def is_block_drafter(config: dict) -> bool:
    """Whether a config.json describes a DFlash block drafter rather than a model."""
    extra = config.get("dflash_config") or {}
    return "block_size" in config and ("target_layer_ids" in extra or "target_layer_ids" in config)


class _Attention(nn.Module):
    def __init__(self, c: BlockDrafterConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.scale = c.num_attention_heads, c.num_key_value_heads, c.head_dim ** -0.5
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = nn.RMSNorm(c.head_dim, eps=c.rms_norm_eps)
        self.k_norm = nn.RMSNorm(c.head_dim, eps=c.rms_norm_eps)
        self.head_dim, self.rope_base = c.head_dim, c.rope_theta

    def rope(self, x: mx.array, offset: int | mx.array) -> mx.array:
        """Qwen3's rotary embedding (not interleaved) from ``offset`` (one, or one per sequence of the batch)."""
        return mx.fast.rope(x, self.head_dim, traditional=False, base=self.rope_base, scale=1.0, offset=offset)

    def keys_values(self, x: mx.array, offset: int | mx.array) -> tuple[mx.array, mx.array]:
        """Keys (B, kv_heads, L, dim), roped from ``offset``, and values of ``x`` (B, L, hidden)."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(b, n, self.kv_heads, -1)).transpose(0, 2, 1, 3)
        return self.rope(k, offset), self.v_proj(x).reshape(b, n, self.kv_heads, -1).transpose(0, 2, 1, 3)

    def project(self, x: mx.array, offsets: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Queries (B, heads, b, dim), keys and values of the block's rows ``x`` (B, b, hidden), each row of
        sequence i at offsets[i] + j, roped."""
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, n, self.heads, -1)).transpose(0, 2, 1, 3)
        return (self.rope(q, offsets), *self.keys_values(x, offsets))

    def attend(self, q: mx.array, k: mx.array, v: mx.array, contexts: list[BlockContext], index: int) -> mx.array:
        """Each sequence's block rows over its context (its layer ``index``) and the whole block (no causal
        mask): (B, heads, b, dim)."""
        return mx.concatenate([mx.fast.scaled_dot_product_attention(
            q[i:i + 1], *context.joined(index, k[i:i + 1], v[i:i + 1]), scale=self.scale)
            for i, context in enumerate(contexts)])


class _Layer(nn.Module):
    def __init__(self, c: BlockDrafterConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

        # The layer around attention, compiled by ``compile`` (a block's few shapes repeat; the context's grow)
        self.before, self.after = self._before, self._after

    def _before(self, x: mx.array, offsets: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return self.self_attn.project(self.input_layernorm(x), offsets)

    def _after(self, x: mx.array, attended: mx.array) -> mx.array:
        b, n, _ = x.shape
        h = x + self.self_attn.o_proj(attended.transpose(0, 2, 1, 3).reshape(b, n, -1))
        out: mx.array = h + self.mlp(self.post_attention_layernorm(h))
        return out

    def compile(self) -> None:
        self.before, self.after = mx.compile(self._before), mx.compile(self._after)

    def __call__(self, x: mx.array, offsets: mx.array, contexts: list[BlockContext], index: int) -> mx.array:
        q, k, v = self.before(x, offsets)
        return self.after(x, self.self_attn.attend(q, k, v, contexts, index))


class BlockDraftModel(nn.Module):
    """The drafter's own weights (see the module docstring); the caller embeds the block and applies the head."""

    def __init__(self, config: BlockDrafterConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = [_Layer(config) for _ in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def context(self, features: mx.array, positions: mx.array) -> list[tuple[mx.array, mx.array]]:
        """Each layer's keys and values (R, kv_heads, 1, dim) of the target's ``features`` (R, layers x hidden),
        row r at ``positions[r]`` (R,): the rows of several sequences at once."""
        h = self.hidden_norm(self.fc(features))[:, None]
        return [layer.self_attn.keys_values(h, positions) for layer in self.layers]

    def __call__(self, x: mx.array, offsets: mx.array, contexts: list[BlockContext]) -> mx.array:
        """The block's hidden states (B, b, hidden), normed, from its embeddings ``x`` (B, b, hidden);
        ``contexts[i]``: sequence i's context."""
        for index, layer in enumerate(self.layers):
            x = layer(x, offsets, contexts, index)
        out: mx.array = self.norm(x)
        return out


class BlockContext:
    """One conversation's context for the drafter: each layer's keys and values of the tokens the target read,
    and the positions they hold (runs may leave gaps: a prefix reused from the pool or the disk tier, or a
    turn read without drafting, was never seen by the drafter; positions stay absolute, and it attends over
    what it has).

    Each layer's rows live in a buffer (1, kv_heads, capacity, dim), written in place after the ``length``
    filled ones, its capacity doubled when they do not fit, its bytes taken from the engine's KV budget where
    there is one; with no room there the context is ``refused`` (its reply decodes without the drafter until
    the next turn). Why, and the figures: docs/drafting.md, "Memory"."""

    CAPACITY_STEP = 256

    def __init__(self, budget: KVBudget | None = None) -> None:
        self.buffers: list[tuple[mx.array, mx.array]] = []  # per layer (1, kv_heads, capacity, dim) each
        self.length = 0  # rows filled
        self.runs: list[tuple[int, int]] = []  # (first position, count) of each appended run, in order
        self.budget = budget
        self.bytes = 0  # of the buffers (taken from the budget, where there is one)
        self.refused = False  # the budget had no room for the buffers
        if budget is not None:
            budget.pools.add(self)

    @property
    def layers(self) -> list[tuple[mx.array, mx.array]]:
        """Each layer's keys and values of the rows held, (1, kv_heads, length, dim) views ([] when empty)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self.buffers] if n else []

    @property
    def capacity(self) -> int:
        return self.buffers[0][0].shape[2] if self.buffers else 0

    @property
    def end(self) -> int:
        """The position after the last one held (0 when empty)."""
        return self.runs[-1][0] + self.runs[-1][1] if self.runs else 0

    def trim(self, position: int) -> None:
        """Keep only the rows before ``position`` (the target was rewound there, or reads it again)."""
        kept, rows = [], 0
        for start, count in self.runs:
            if start >= position:
                break
            kept.append((start, min(count, position - start)))
            rows += kept[-1][1]
        self.runs, self.length = kept, rows
        if not rows:
            self.drop()

    def append(self, start: int, layers: list[tuple[mx.array, mx.array]]) -> None:
        """Rows for positions start, start + 1, ... (each layer's keys and values, (1, kv_heads, L, dim));
        nothing once the budget refused the context."""
        self.trim(start)
        count = layers[0][0].shape[2]
        if self.refused or (self.length + count > self.capacity and not self._grow(self.length + count, layers)):
            return
        at = mx.array([self.length])
        # A new array per write (the buffer of a fork is not changed); the old one, read by nothing pending
        # once the step's pass ran, is written in place
        self.buffers = [(mx.slice_update(k0, k, at, axes=(2,)), mx.slice_update(v0, v, at, axes=(2,)))
                        for (k0, v0), (k, v) in zip(self.buffers, layers)]
        self.length += count
        self.runs.append((start, count))

    def joined(self, index: int, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Layer ``index``'s keys and values of the rows held followed by a block's ``k``, ``v`` (1, kv_heads,
        b, dim): the block written past the rows held where the buffer has room (the next append writes over
        it), so the context is not copied each round; else joined to a copy."""
        n, b = self.length, k.shape[2]
        if n + b > self.capacity:
            held = self.layers[index] if n else None
            return (mx.concatenate([held[0], k], axis=2), mx.concatenate([held[1], v], axis=2)) if held else (k, v)
        at = mx.array([n])
        keys, values = (mx.slice_update(old, new, at, axes=(2,)) for old, new in zip(self.buffers[index], (k, v)))
        self.buffers[index] = (keys, values)
        return keys[:, :, :n + b], values[:, :, :n + b]

    def _grow(self, needed: int, like: list[tuple[mx.array, mx.array]]) -> bool:
        """Buffers of at least ``needed`` rows (twice the capacity, where that is more and the budget has the
        room), the rows held copied; False, the context dropped and refused, when the budget has no room."""
        least = -(-needed // self.CAPACITY_STEP) * self.CAPACITY_STEP
        row_bytes = sum(part.shape[1] * part.shape[3] * part.dtype.size for both in like for part in both)
        room = None if self.budget is None else self.budget.free + self.bytes
        fits = [c for c in (max(least, 2 * self.capacity), least) if room is None or c * row_bytes <= room]
        if not fits:
            self.drop()
            self.refused = True
            return False
        grown = [(mx.zeros((1, k.shape[1], fits[0], k.shape[3]), k.dtype),
                  mx.zeros((1, v.shape[1], fits[0], v.shape[3]), v.dtype)) for k, v in like]
        for (keys, values), (old_k, old_v) in zip(grown, self.layers):  # the rows held (none when empty)
            keys[:, :, :self.length], values[:, :, :self.length] = old_k, old_v
        self.buffers = grown
        self._claim(fits[0] * row_bytes)
        return True

    def _claim(self, size: int) -> None:
        """Hold ``size`` bytes of the budget instead of those held (the caller checked they fit)."""
        if self.budget is not None:
            self.budget.give(self.bytes)
            self.budget.force(size)
        self.bytes = size

    def drop(self) -> int:
        """Hold nothing (the drafter reads on from its next rows); the bytes given back."""
        freed = self.bytes
        self._claim(0)
        self.buffers, self.length, self.runs = [], 0, []
        return freed

    def release_free_slabs(self, cached: bool = False) -> int:
        """The budget's reclaim (``KVBudget.reclaim``): drop the context; bytes freed."""
        return self.drop() if cached else 0

    def reclaimable_bytes(self) -> int:
        return self.bytes

    def __del__(self) -> None:
        self.drop()  # a conversation's caches dropped without a release: the bytes go back to the budget

    def fork(self) -> BlockContext:
        """A context holding the same rows (sharing the buffers until either writes), its bytes taken too;
        an empty one where the budget has no room for them."""
        other = BlockContext(self.budget)
        if self.buffers and (self.budget is None or self.bytes <= self.budget.free):
            other.buffers, other.length, other.runs = list(self.buffers), self.length, list(self.runs)
            other._claim(self.bytes)
        return other


def block_length(model: BlockDraftModel) -> int:
    """The block a pass drafts (the last token included): the device profile's, at most the folder's."""
    return max(2, min(current().draft_block, model.config.block_size))


def load_block_drafter(folder: Path, target: nn.Module) -> BlockDraftModel:
    """The block drafter in ``folder`` for ``target`` (an mlx-lm Qwen3 model); ``ModelLoadError`` in one line
    when it does not fit the target (hidden size, vocabulary, layers) or its weights do not fit its config."""
    config = BlockDrafterConfig.read(folder)
    check_fits_target(config, target, folder.name)
    model = BlockDraftModel(config)
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        weights.update(cast("dict[str, mx.array]", mx.load(str(path))))
    # A torch export may keep a "model." prefix; the rotary table is recomputed here; an embedding or head saved
    # beside the drafter's own weights is the target's (the target's own serve).
    weights = {name.removeprefix("model."): w for name, w in weights.items()
               if "rotary_emb" not in name and not name.removeprefix("model.").startswith(("embed_tokens", "lm_head"))}
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as error:
        raise ModelLoadError(f"The weights in {folder} do not fit its config.json ({str(error)[:200]}).") from None
    model.set_dtype(activation_dtype(target))  # the dtype of the target's hidden states
    model.eval()
    if compile_works():
        for layer in model.layers:
            layer.compile()
    return model


def check_fits_target(config: BlockDrafterConfig, target: nn.Module, name: str) -> None:
    """``ModelLoadError`` (one line) unless the drafter reads ``target``'s hidden states and vocabulary."""
    if not has_split_layers(target):
        raise ModelLoadError(f"The block drafter {name} drafts for Qwen3 targets (its layers run split here); "
                             "this target is another kind: run it with a draft model or --draft lookup.")
    args = target.args
    layers = args.num_hidden_layers
    vocab = args.vocab_size
    if config.hidden_size != args.hidden_size:
        raise ModelLoadError(f"The block drafter {name} is for a model of hidden size {config.hidden_size}, and "
                             f"this target's is {args.hidden_size}: use the drafter made for this model.")
    if config.vocab_size != vocab:
        raise ModelLoadError(f"The block drafter {name} has a vocabulary of {config.vocab_size:,} tokens, and "
                             f"this target's has {vocab:,}: use the drafter made for this model.")
    beyond = [i for i in config.target_layer_ids if not 0 <= i < layers]
    if beyond:
        raise ModelLoadError(f"The block drafter {name} reads target layers {beyond}, and this target has "
                             f"{layers} layers: use the drafter made for this model.")
    if not 0 <= config.mask_token_id < vocab or config.block_size < 2:
        raise ModelLoadError(f"The block drafter {name} has mask token {config.mask_token_id} and block size "
                             f"{config.block_size}: it needs a token of the vocabulary and a block of 2 or more.")
