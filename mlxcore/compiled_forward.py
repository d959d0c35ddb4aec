"""The layers of Qwen3-layout models as the batched pass runs them: mlx-lm's own layers, split around
attention and fused by ``mx.compile``.

Every pass of such a model is rows of one batched pass (``batching/batch_forward.py``): a lone reply's
decode row, a batch's decode rows, a speculative round's verification and draft rows, prompt chunks.
Each layer runs as two functions (before and after attention) around the cache's write and attention;
attention is ``decode_attention.attend`` over each sequence's segments (a paged cache hands over its runs
of blocks as views, no copy of the sequence per step). A step of a small model is mostly kernel
launches (norms, RoPE, SwiGLU, residuals are each several small ops on MLX's CPU backend), so the halves
are compiled for rows of decoding replies (a count that repeats); a prompt's chunk lengths vary, and each
new one would compile anew, so prompt rows alone run the same halves uncompiled, with the device's
SwiGLU (on the CPU, SiLU through ``fast_exp``: MLX's CPU ``exp`` runs one element at a time). The logits
equal the model's own to float rounding (tests compare them on the CPU; Metal's kernels differ by shape,
so there bf16 rounding may differ too: docs/internals.md, "What is exact on which device").
``MLXCHAT_COMPILE=0`` turns compiling off; so does a platform where compiling fails
(``report_compile_failure`` tells the user why): the same halves then run uncompiled.

Other models (hybrid ones, Qwen3.5) run mlx-lm's layers whole: ``CompiledForward`` is then called like
the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

from mlxcore.compile_support import compile_works
from mlxcore.device_profile import current
from mlxcore.fast_exp import fast_silu
from mlxcore.fused_linear import fuse
from mlxcore.kv.protocol import LayerCache

Gate = Callable[[mx.array, mx.array], mx.array]  # SwiGLU: gate, up -> activation
MAX_COMPILED_TOKENS = 16  # a decoding reply's rows (a decode row, a verification of k + 1) run compiled up to this
_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
_ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "rope", "n_heads", "n_kv_heads", "scale")
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")
SPLIT_MODEL_TYPES = ("qwen3", "qwen3_moe")


def has_split_layers(model: nn.Module) -> bool:
    """True when this module can run ``model``'s layers split around attention: dense Qwen3, or Qwen3-MoE
    (Qwen3's attention; its expert MLP is called as mlx-lm has it)."""
    return _has_qwen3_attention(model, SPLIT_MODEL_TYPES)


def _has_qwen3_attention(model: nn.Module, model_types: tuple[str, ...]) -> bool:
    if getattr(getattr(model, "args", None), "model_type", None) not in model_types:
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers or not hasattr(inner, "embed_tokens") or not hasattr(inner, "norm"):
        return False
    return all(all(hasattr(layer, p) for p in _LAYER_PARTS)
               and all(hasattr(layer.self_attn, p) for p in _ATTENTION_PARTS) for layer in layers)


def _dense_mlp(mlp: nn.Module) -> bool:
    return all(hasattr(mlp, p) for p in _MLP_PARTS)


class _FusedLayer:
    """One decoder layer as 'before attention' and 'after attention' functions, compiled if ``compiled``.

    The queries come out already multiplied by the attention scale (one multiply fewer per layer).
    ``before_batch`` takes a row per token (rows, 1, hidden), each at its own position, and gives the keys
    and values stacked as the block pool's scatter takes them (``batching/batch_forward.py``);
    ``before_rows`` and ``after_rows`` are the halves for prompt rows with no decode row beside them, never
    compiled (a prompt's chunk lengths vary).
    """

    def __init__(self, layer: nn.Module, compiled: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.heads = attn.n_heads
        qkv = fuse([attn.q_proj, attn.k_proj, attn.v_proj])  # one product where the formats allow
        if _dense_mlp(mlp):
            gate_up = fuse([mlp.gate_proj, mlp.up_proj])

            def feed_forward(x: mx.array, gated: Gate = swiglu) -> mx.array:
                gate, up = gate_up(x)
                out: mx.array = mlp.down_proj(gated(gate, up))
                return out
        else:  # Qwen3-MoE's sparse block: its router and experts as mlx-lm runs them (its own SwiGLU)
            def feed_forward(x: mx.array, gated: Gate = swiglu) -> mx.array:
                out: mx.array = mlp(x)
                return out

        def before(h: mx.array, offset: mx.array) -> tuple[mx.array, mx.array, mx.array]:
            b, n, _ = h.shape
            q, k, v = qkv(layer.input_layernorm(h))
            q = attn.q_norm(q.reshape(b, n, attn.n_heads, -1)).transpose(0, 2, 1, 3)
            k = attn.k_norm(k.reshape(b, n, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
            v = v.reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            return attn.rope(q, offset=offset) * attn.scale, attn.rope(k, offset=offset), v

        def before_batch(h: mx.array, offsets: mx.array) -> tuple[mx.array, mx.array]:
            q, k, v = before(h, offsets)  # h (B, 1, hidden), offsets (B,)
            return q, mx.concatenate([k, v], axis=2).transpose(2, 1, 0, 3)  # keys, values: (2, kv_heads, B, dim)

        def after(h: mx.array, attended: mx.array, gated: Gate = swiglu) -> mx.array:
            b, n, _ = h.shape
            h = h + attn.o_proj(attended.transpose(0, 2, 1, 3).reshape(b, n, -1))
            return h + feed_forward(layer.post_attention_layernorm(h), gated)

        def after_parts(h: mx.array, out: mx.array, total: mx.array) -> mx.array:
            b, n, _ = h.shape  # out, total: decode_attention.attend_parts' grouped layout
            return after(h, (out / total).astype(out.dtype).reshape(b, attn.n_heads, n, -1))

        wrap = mx.compile if compiled else (lambda fn: fn)
        self.before_batch = wrap(before_batch)
        self.after_final, self.after_parts = wrap(after), wrap(after_parts)  # (attention divided already, or not)
        self.before_rows = before_batch  # prompt rows alone: uncompiled, the device's SwiGLU
        self.after_rows: Callable[[mx.array, mx.array], mx.array] = lambda h, out: after(h, out, _device_swiglu)


def _device_swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """SwiGLU for a prompt chunk: the CPU's takes SiLU through ``fast_exp`` (float32 only)."""
    return fast_silu(gate) * up if current().fast_exp and gate.dtype == mx.float32 else swiglu(gate, up)


class CompiledForward:
    """A model's forward: ``logits`` and the split layers (``_layers``) for the batched pass of a model split
    here (``split``: the Qwen3 layout; ``enabled``: compiled); called like the model, its own layers whole
    (a model not split here, the tests' reference). ``model`` and ``args`` are the wrapped model's."""

    def __init__(self, model: nn.Module) -> None:
        self.wrapped = model
        self.model: nn.Module = model.model if hasattr(model, "model") else model
        self.args = getattr(model, "args", None)
        self.split = has_split_layers(model)
        self.enabled = self.split and compile_works()
        if self.split:
            self._layers = [_FusedLayer(layer, self.enabled) for layer in self.model.layers]
            assert self.args is not None, "a model split here has mlx-lm's args"
            inner, lm_head = self.model, None if self.args.tie_word_embeddings else model.lm_head

            def head(h: mx.array) -> mx.array:
                logits: mx.array = (inner.embed_tokens.as_linear(inner.norm(h)) if lm_head is None
                                    else lm_head(inner.norm(h)))
                return logits

            self.logits: Callable[[mx.array], mx.array] = mx.compile(head) if self.enabled else head

    def __call__(self, inputs: mx.array, cache: Sequence[LayerCache] | None = None) -> mx.array:
        logits: mx.array = self.wrapped(inputs, cache=cache)
        return logits
