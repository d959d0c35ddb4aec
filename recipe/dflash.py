"""A DFlash block drafter in PyTorch, in z-lab's published layout (github.com/z-lab/dflash; arXiv 2602.06036).

The drafter is a few Qwen3 decoder layers without embeddings or an output head of their own: it borrows the
target's ``embed_tokens`` and ``lm_head``. Its attention reads two sources at once:

- the context: the target's hidden states at ``target_layer_ids`` for every token before the block
  (``hidden_states[layer_id + 1]`` of transformers' ``output_hidden_states``, i.e. the output of decoder
  layer ``layer_id``, before the final norm), concatenated and projected by ``fc`` then ``hidden_norm``;
  each layer's ``k_proj``/``v_proj`` read it as it is (no input norm);
- the block itself, non-causally: ``[last accepted token, mask, mask, ...]`` at positions ``start ...``.

The output at each mask position is the drafter's guess for the token at that position.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from recipe.config import TARGET, VOCAB_SIZE, ModelShape


@dataclass(frozen=True)
class DFlashSpec:
    """What the drafter is and what it reads from the target."""

    shape: ModelShape                   # its own decoder layers (the target's width)
    block_size: int                     # tokens per block: the anchor plus block_size - 1 masks
    target_layer_ids: tuple[int, ...]   # decoder layers of the target whose outputs form the context
    mask_token_id: int                  # the token id of every masked block position
    num_target_layers: int = TARGET.layers
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ValueError(f"block_size must be at least 2, got {self.block_size}")
        if not all(0 <= i < self.num_target_layers - 1 for i in self.target_layer_ids):
            # The last layer's output is read after the final norm by transformers, before it by a layer hook:
            # leaving it out keeps the two conventions the same.
            raise ValueError(f"target_layer_ids must lie in 0..{self.num_target_layers - 2}: {self.target_layer_ids}")


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Qwen3's rotary embedding (halves, not interleaved). x: (B, heads, N, d); positions: (B, N)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    angles = positions.to(torch.float32)[:, None, :, None] * inv          # (B, 1, N, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


class Attention(nn.Module):
    def __init__(self, s: DFlashSpec) -> None:
        super().__init__()
        sh = s.shape
        self.heads, self.kv_heads, self.head_dim, self.theta = sh.heads, sh.kv_heads, sh.head_dim, s.rope_theta
        self.q_proj = nn.Linear(sh.hidden, sh.heads * sh.head_dim, bias=False)
        self.k_proj = nn.Linear(sh.hidden, sh.kv_heads * sh.head_dim, bias=False)
        self.v_proj = nn.Linear(sh.hidden, sh.kv_heads * sh.head_dim, bias=False)
        self.o_proj = nn.Linear(sh.heads * sh.head_dim, sh.hidden, bias=False)
        self.q_norm = nn.RMSNorm(sh.head_dim, eps=s.rms_norm_eps)
        self.k_norm = nn.RMSNorm(sh.head_dim, eps=s.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], n, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, x_pos: torch.Tensor, ctx_pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """x: (B, N, H) block rows; ctx: (B, T, H) context rows; mask: (B, 1, N, T + N), True = may attend."""
        q = rotate(self.q_norm(self._heads(self.q_proj(x), self.heads)), x_pos, self.theta)
        keys = torch.cat([self.k_proj(ctx), self.k_proj(x)], 1)
        values = torch.cat([self.v_proj(ctx), self.v_proj(x)], 1)
        k = rotate(self.k_norm(self._heads(keys, self.kv_heads)), torch.cat([ctx_pos, x_pos], 1), self.theta)
        v = self._heads(values, self.kv_heads)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class MLP(nn.Module):
    def __init__(self, sh: ModelShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(sh.hidden, sh.intermediate, bias=False)
        self.up_proj = nn.Linear(sh.hidden, sh.intermediate, bias=False)
        self.down_proj = nn.Linear(sh.intermediate, sh.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s: DFlashSpec) -> None:
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s.shape)
        self.input_layernorm = nn.RMSNorm(s.shape.hidden, eps=s.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(s.shape.hidden, eps=s.rms_norm_eps)

    def forward(self, h: torch.Tensor, ctx: torch.Tensor, h_pos: torch.Tensor, ctx_pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), ctx, h_pos, ctx_pos, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """The drafter's own weights, named as z-lab's ``DFlashDraftModel`` names them (its state dict is the file)."""

    def __init__(self, spec: DFlashSpec, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.spec = spec
        hidden = spec.shape.hidden
        self.fc = nn.Linear(len(spec.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = nn.RMSNorm(hidden, eps=spec.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.shape.layers))
        self.norm = nn.RMSNorm(hidden, eps=spec.rms_norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)  # transformers' Qwen3 initializer_range

    def forward(self, block_embeds: torch.Tensor, block_pos: torch.Tensor, target_hidden: torch.Tensor,
                ctx_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Hidden states of the block rows, after the final norm; the caller applies the target's lm_head.

        block_embeds: (B, N, H), the target's embeddings of the block tokens; block_pos: (B, N) positions;
        target_hidden: (B, T, len(target_layer_ids) * H); ctx_pos: (B, T); mask: (B, 1, N, T + N) bool.
        """
        ctx = self.hidden_norm(self.fc(target_hidden))
        h = block_embeds
        for layer in self.layers:
            h = layer(h, ctx, block_pos, ctx_pos, mask)
        return self.norm(h)


def context_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: tuple[int, ...]) -> torch.Tensor:
    """The drafter's context input from transformers' ``output_hidden_states`` (index 0 is the embeddings)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], -1)


def config_dict(spec: DFlashSpec, dtype: str = "bfloat16") -> dict:
    """config.json with the fields of z-lab's published Qwen3 drafters (e.g. Qwen3-8B-DFlash-b16)."""
    sh = spec.shape
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": spec.block_size,
        "bos_token_id": None,
        "dflash_config": {"mask_token_id": spec.mask_token_id, "target_layer_ids": list(spec.target_layer_ids)},
        "dtype": dtype,
        "eos_token_id": 2,
        "head_dim": sh.head_dim,
        "hidden_act": "silu",
        "hidden_size": sh.hidden,
        "initializer_range": 0.02,
        "intermediate_size": sh.intermediate,
        "layer_types": ["full_attention"] * sh.layers,
        "max_position_embeddings": 4096,
        "max_window_layers": sh.layers,
        "model_type": "qwen3",
        "num_attention_heads": sh.heads,
        "num_hidden_layers": sh.layers,
        "num_key_value_heads": sh.kv_heads,
        "num_target_layers": spec.num_target_layers,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": spec.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }


def save(drafter: DFlashDrafter, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write ``folder``/config.json and model.safetensors as z-lab publishes them (bfloat16, no embeddings)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():
        stale.unlink()
    name = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config_dict(drafter.spec, name), indent=2) + "\n")
    weights = {k: v.detach().to("cpu", dtype).contiguous() for k, v in drafter.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


def load(folder: Path) -> DFlashDrafter:
    """A drafter from a folder ``save`` wrote (weights upcast to float32 for the CPU)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    shape = ModelShape(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
                       cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"])
    dc = cfg["dflash_config"]
    spec = DFlashSpec(shape, cfg["block_size"], tuple(dc["target_layer_ids"]), dc["mask_token_id"],
                      cfg["num_target_layers"], cfg["rope_theta"], cfg["rms_norm_eps"])
    drafter = DFlashDrafter(spec)
    drafter.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    return drafter.eval()


def start_from_target(drafter: DFlashDrafter, target) -> None:
    """Begin where the target ends: its last layers, its final norm, and ``fc`` passing the last context layer.

    The drafter's layers get the target's last ones (same shapes) and its output norm the target's, whose
    lm_head it borrows; ``fc`` starts as the identity on the deepest chosen layer's slot (the others keep
    their small random weights) and ``hidden_norm`` as the norm the target applies to that layer's output.
    """
    layers = target.model.layers
    deepest = max(drafter.spec.target_layer_ids)
    with torch.no_grad():
        for mine, theirs in zip(drafter.layers, layers[len(layers) - len(drafter.layers):]):
            mine.load_state_dict(theirs.state_dict(), strict=False)
        drafter.norm.weight.copy_(target.model.norm.weight)
        drafter.hidden_norm.weight.copy_(layers[deepest + 1].input_layernorm.weight)
        hidden = drafter.spec.shape.hidden
        slot = drafter.spec.target_layer_ids.index(deepest)
        drafter.fc.weight[:, slot * hidden:(slot + 1) * hidden] = torch.eye(hidden)
