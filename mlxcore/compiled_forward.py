"""A faster forward pass for decoding Qwen3-layout models: mlx-lm's own layers, fused by ``mx.compile``.

A decode step of a small model is mostly kernel launches (norms, RoPE, SwiGLU,
residuals are each several small ops on MLX's CPU backend). Between two KV-cache
updates nothing touches the cache, so each layer runs as two compiled functions
(before and after attention) around the cache update and attention. Attention is
``decode_attention.attend`` over the cache's segments: a paged cache hands over
its runs of blocks as views (no copy of the sequence per step); other caches
their one array. The logits equal the model's own to float rounding (tests
compare them on the CPU; Metal's kernels differ by shape, so there bf16 rounding
may differ too: docs/internals.md, "What is exact on which device").

Only short inputs run compiled (decode steps, speculative verification): each
new input length compiles new kernels. Prompts are read as rows of the batched
pass (``batching/batch_forward.py``, ``prefill.py``), through the halves
``before_rows`` and ``after_rows``; those and longer inputs given to the forward
itself run the same layers uncompiled, with the device's SwiGLU (on
the CPU, SiLU through ``fast_exp``: MLX's CPU ``exp`` runs one element at a time)
and attention through ``decode_attention.attend`` (on the CPU, key blocks that
stay in cache).
``MLXCHAT_COMPILE=0`` turns compiling off; so does a platform where compiling
fails (``report_compile_failure`` tells the user why): the same layers then run
uncompiled, so attention still reads segments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.compile_support import compile_works
from mlxcore.decode_attention import Attended, attend, attend_parts
from mlxcore.device_profile import current
from mlxcore.fast_exp import fast_silu
from mlxcore.fused_linear import fuse
from mlxcore.kv.protocol import LayerCache, Mask, Segment

Gate = Callable[[mx.array, mx.array], mx.array]  # SwiGLU: gate, up -> activation
MAX_COMPILED_TOKENS = 16  # decode (1) and verification (k + 1) lengths; longer inputs run uncompiled
# Lengths whose kernels a warm-up builds: one decode step, and one verification block, whose kernels
# every other block length reuses (measured on the embedded target: 18 kernels for 1, 8 more for 2, none after).
WARM_UP_LENGTHS = (1, 2)
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
    ``before_batch`` is ``before`` for a batch of one new token per sequence, with the keys and
    values stacked as the block pool's scatter takes them (``batching/batch_forward.py``); ``before_rows`` and
    ``after_rows`` are its halves for prompt rows with no decode row beside them, never compiled (a prompt's
    chunk lengths vary). ``chunk`` is the whole layer for a longer input given to the forward at once (a
    verification block past ``MAX_COMPILED_TOKENS``: ``--num-draft`` over 15), never compiled.
    """

    def __init__(self, layer: nn.Module, compiled: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
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
        self.before, self.before_batch = wrap(before), wrap(before_batch)
        self._after, self._after_parts = wrap(after), wrap(after_parts)
        self._before_chunk, self._after_chunk = before, lambda h, attended: after(h, attended, _device_swiglu)
        self.before_rows, self.after_rows = before_batch, self._after_chunk  # prompt rows alone: as ``chunk``

    def after(self, h: mx.array, parts: Attended) -> mx.array:
        """The rest of the layer after attention; the attention's last division runs inside it."""
        out, total = parts
        return self._after(h, out) if total is None else self._after_parts(h, out, total)

    def chunk(self, h: mx.array, offset: mx.array, mask: Mask, cache: LayerCache) -> mx.array:
        """The layer for a prompt chunk of any length: uncompiled (no kernels built per length), attention over
        the sequence's runs as they lie, the device's SwiGLU."""
        q, k, v = self._before_chunk(h, offset)
        segments, mask = _updated(cache, q, k, v, mask)
        return self._after_chunk(h, attend(q, segments, 1.0, mask))

    def __call__(self, h: mx.array, offset: mx.array, mask: Mask, cache: LayerCache) -> mx.array:
        q, k, v = self.before(h, offset)
        segments, mask = _updated(cache, q, k, v, mask)
        return self.after(h, attend_parts(q, segments, 1.0, mask))  # q carries the scale


def _updated(cache: LayerCache, q: mx.array, keys: mx.array, values: mx.array, mask: Mask
             ) -> tuple[list[Segment], Mask]:
    """Write ``keys`` and ``values`` into ``cache``; the sequence's segments for ``q``'s attention, and the mask
    to attend with: a paged cache's runs of blocks as views (or one span, with its mask), another cache's one
    array."""
    read = getattr(cache, "update_and_read", None)  # a paged layer's (kv/paged.py)
    if read is not None:
        read_back: tuple[list[Segment], Mask] = read(keys, values, mask, q.shape[1])
        return read_back
    return [cache.update_and_fetch(keys, values)], mask


def _device_swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """SwiGLU for a prompt chunk: the CPU's takes SiLU through ``fast_exp`` (float32 only)."""
    return fast_silu(gate) * up if current().fast_exp and gate.dtype == mx.float32 else swiglu(gate, up)


class CompiledForward:
    """Called like the model, ``forward(inputs, cache=layers)`` -> logits; see the module docstring.

    ``model`` and ``args`` are the wrapped model's, so decoders can use either. ``split``: the
    model's layers run split around attention (Qwen3 layout); ``enabled``: and compiled.
    """

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

            self._head: Callable[[mx.array], mx.array] = mx.compile(head) if self.enabled else head
            self._head_long = head

    def __call__(self, inputs: mx.array, cache: Sequence[LayerCache] | None = None) -> mx.array:
        if not self.split or cache is None:
            logits: mx.array = self.wrapped(inputs, cache=cache)
            return logits
        short = inputs.shape[1] <= MAX_COMPILED_TOKENS
        h = self.body(inputs, cache, compiled=short)
        return self._head(h) if short else self._head_long(h)

    def body(self, inputs: mx.array, cache: Sequence[LayerCache], compiled: bool = False) -> mx.array:
        """The layers' output for ``inputs`` (B, L), written into ``cache`` (no logits), through
        ``_FusedLayer.chunk``; ``compiled``: the compiled layers (a decode step or a
        verification block). Before the final norm here; the model's own (normed) for a model not split here."""
        if not self.split:
            out: mx.array = self.model(inputs, cache=cache)
            return out
        h: mx.array = self.model.embed_tokens(inputs)
        mask = create_attention_mask(h, cache[0])
        offset = mx.array(cache[0].offset, dtype=mx.int32)  # an array: one compiled graph for every position
        for layer, layer_cache in zip(self._layers, cache):
            h = layer(h, offset, mask, layer_cache) if compiled else layer.chunk(h, offset, mask, layer_cache)
        return h

    def warm_up(self) -> None:
        """Build the compiled kernels now, on a throwaway cache, rather than during the first reply.

        On Linux, MLX compiles them with the system C++ compiler the first time a
        machine sees them (tens of seconds), then reuses them from its disk cache.
        """
        if not self.enabled:
            return
        cache = make_prompt_cache(self.wrapped)
        for n in WARM_UP_LENGTHS:
            mx.eval(self(mx.zeros((1, n), dtype=mx.int32), cache=cache))
        h = self.model.embed_tokens(mx.zeros((2, 1), dtype=mx.int32))  # a batched step's first half
        mx.eval(self._layers[0].before_batch(h, mx.zeros((2,), dtype=mx.int32)))
