"""Attention of a few queries (a decode step, a speculative verification block) over keys held in segments.

A paged sequence lies in storage as a few runs of adjacent blocks (one per slab
it crosses, more after a fork or a prefix hit). Gathering them into one array
every step would copy the whole sequence per token; here each run is read
where it lies (a view) and the runs meet only in the score row, which is small
(query rows x keys): one softmax over the concatenated scores, then each run's
weights times its own values, summed.

Queries are grouped by the kv head they share: (1, kv_heads, rep * L, dim)
against (1, kv_heads, keys, dim) is one plain matrix product per run, where
MLX's CPU attention broadcasts a 5-D product per query head.

- The GPU (``device_profile``'s ``fused_attention``): one segment of float keys
  goes to ``mx.fast.scaled_dot_product_attention`` (its fused kernel), a batch's
  padded rows with their mask too, and so do several segments joined when the
  scores would outweigh the copy (a prompt chunk); a decode step over several
  segments (joining them would copy the sequence every step) and quantized keys
  take the grouped products above with MLX's softmax.
- The CPU: the grouped products, with the softmax's exp from ``fast_exp``
  (MLX's CPU exp runs one element at a time; figures in docs/device-profile.md);
  a causal chunk of queries (a prompt read alone or beside decoding) in blocks of
  keys that stay in cache (``cpu_attention``), quantized runs made float first.
  Outputs agree to float32 rounding.

A reply's rows over one place of float storage (``run_attention``: a lone reply's decode row, verifications)
take the same operations compiled shapeless, so that a layer calls them without a Python frame.
"""

from __future__ import annotations

import itertools
from functools import lru_cache, partial
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import mlx.core as mx

from mlxcore.compile_support import compile_works
from mlxcore.cpu_attention import reads_spans, segmented_causal_attention
from mlxcore.device_profile import current
from mlxcore.fast_exp import exp_below_parts
from mlxcore.kv.protocol import FloatSegment, Mask, Part, Segment



Quantized = tuple[mx.array, mx.array, mx.array]  # packed words, scales, biases
Attended = tuple[mx.array, mx.array | None]  # (out, row sums to divide it by, or None when out is final)
Attention = Callable[[mx.array, list[Segment]], Attended]  # queries and their segments -> ``Attended``


def attend(q: mx.array, segments: list[Segment], scale: float, mask: Mask = None) -> mx.array:
    """Softmax attention of ``q`` (1, heads, L, dim) over the keys of ``segments`` in order; (1, heads, L, dim).

    ``mask``: None (every query sees every key), ``"causal"`` (the queries are the
    last L positions) or an array broadcast to (L, keys): boolean (True = seen) or
    additive.
    """
    return normalized(attend_parts(q, segments, scale, mask), q.shape)


def attend_parts(q: mx.array, segments: list[Segment], scale: float, mask: Mask = None) -> Attended:
    """``attend`` before its last division: (out, total), so that a caller can fold ``out / total`` and the
    reshape to (B, heads, L, dim) into its own compiled step (``normalized`` does them otherwise).
    out: (B, kv_heads, rep * L, dim) unnormalised, total: (B, kv_heads, rep * L, 1); or (attention, None)."""
    return attention_for(q, segments, scale, mask)(q, segments)


def attention_for(q: mx.array, segments: list[Segment], scale: float, mask: Mask = None,
                  final: bool = False) -> Attention:
    """``attend_parts`` decided for queries and segments of these shapes and this mask (``final``: its out
    divided already, as ``attend`` gives it, total None). Every layer of a pass reads alike (the same rows
    over the same runs), so a pass decides once and each layer calls the function this returns, with its
    own queries and segments."""
    profile = current()
    quantized = isinstance(segments[0][0], tuple)
    dim = q.shape[-1]
    if profile.fast_exp and isinstance(mask, str) and _scores_outgrow_cache(q, segments):  # a long prompt chunk
        def blocked(q: mx.array, segments: list[Segment]) -> Attended:
            floats = dequantized(segments, dim) if quantized else cast("list[FloatSegment]", segments)
            return segmented_causal_attention(q, floats, scale), None
        return blocked
    if (profile.fused_attention and not quantized and (len(segments) == 1 or _scores_outweigh_keys(q, segments))
            or not _grouped_mask_ok(mask)):
        def fused(q: mx.array, segments: list[Segment]) -> Attended:
            keys, values = _joined(dequantized(segments, dim) if quantized else segments)
            return mx.fast.scaled_dot_product_attention(q, cast(mx.array, keys), cast(mx.array, values), scale=scale,
                                                        mask=mask), None
        return fused
    n = q.shape[2]
    if isinstance(mask, str):  # causal: query i sees keys up to keys - n + i (made once, for every layer)
        keys = sum(_length(k) for k, _ in segments)
        mask = None if n == 1 else mx.arange(keys)[None] <= mx.arange(n)[:, None] + (keys - n)
    masking = None if mask is None else partial(_masked, mask=mask.reshape(mask.shape[-2:]), n=n)
    return partial(_grouped, scale=scale, mask=masking, fast=profile.fast_exp, final=final)


FusedRun = Callable[[mx.array, mx.array, mx.array], mx.array]  # (queries, keys, values) -> attention


class ExpParts(Protocol):
    """(queries, keys, the mask if any) -> the exp parts of the scores."""

    def __call__(self, q: mx.array, keys: mx.array, *mask: mx.array) -> tuple[mx.array, mx.array]: ...


Weighted = Callable[[mx.array, mx.array], mx.array]  # (weights, values) -> attention


@lru_cache(maxsize=64)
def run_attention(fused: bool, rows: int, heads: int, kv_heads: int,
                  dim: int) -> tuple[FusedRun, None] | tuple[ExpParts, Weighted]:
    """Attention of one sequence's ``rows`` queries (rows, heads, 1, dim; scaled: a decode row, a
    verification's) over one run of float keys and values (1, kv_heads, T, dim) each, in compiled shapeless
    pieces: a new length does not trace anew, and a layer calls them without a Python frame (a lone reply's
    pass runs them in every layer). (first, then):

    - ``fused`` (one row: MLX builds a fused kernel's masks from the shapes it first sees): first(q, keys,
      values) is the attention, shaped as the queries; then is None;
    - the grouped products, the operations of ``_grouped``: first(q, keys, *mask) gives the exp parts of the
      scores (``fast_exp``; the mask is ``grouped_mask``'s, none for one row that sees every key), their view
      to float32 stays outside (it cannot be shapeless), then(weights, values) the attention, shaped as the
      queries.

    The shapes they reshape by are baked into the trace, so each (rows, heads, kv_heads, dim) has its own."""
    assert rows == 1 or not fused, "several rows take the grouped products"
    grouped, out_shape = (1, kv_heads, heads // kv_heads * rows, dim), (1, heads, rows, dim)

    def attention(q: mx.array, keys: mx.array, values: mx.array) -> mx.array:
        out = mx.fast.scaled_dot_product_attention(q.transpose(2, 1, 0, 3), keys, values, scale=1.0)
        return out.transpose(2, 1, 0, 3)

    def exp_parts(q: mx.array, keys: mx.array, *mask: mx.array) -> tuple[mx.array, mx.array]:
        scores = (q.transpose(2, 1, 0, 3).reshape(grouped) @ keys.swapaxes(-1, -2)).astype(mx.float32)
        if mask:
            scores = mx.where(mask[0], scores, -mx.inf)
        return exp_below_parts()(scores, mx.max(scores, axis=-1, keepdims=True))

    def weighted(weights: mx.array, values: mx.array) -> mx.array:
        total = mx.sum(weights, axis=-1, keepdims=True)
        out = weights.astype(values.dtype) @ values
        return _as(out / total, out.dtype).reshape(out_shape).transpose(2, 1, 0, 3)

    if not compile_works():
        return (attention, None) if fused else (exp_parts, weighted)
    if fused:
        return mx.compile(attention, shapeless=True), None
    return mx.compile(exp_parts, shapeless=True), mx.compile(weighted, shapeless=True)


def grouped_mask(mask: mx.array | str, rows: int, heads: int, kv_heads: int, keys: int) -> tuple[mx.array, ...]:
    """``run_attention``'s mask for ``rows`` queries over ``keys`` slots: ``mask``, "causal" (the queries are the
    last positions, each seeing the keys up to its own) or booleans (rows, keys) (a span's: ``PagedCache.read_plan``),
    as (rep * rows, keys), a row per (query head of a kv head, query); none (an empty tuple) for one causal row,
    which sees every key."""
    if isinstance(mask, str):
        if rows == 1:
            return ()
        mask = mx.arange(keys)[None] <= mx.arange(rows)[:, None] + (keys - rows)
    return (mx.tile(mask, (heads // kv_heads, 1)),)


def dequantized(segments: list[Segment], dim: int) -> list[FloatSegment]:
    """Float keys and values of quantized segments (for attention that cannot read them as stored)."""
    def one(parts: Part) -> mx.array:
        packed, scales, biases = cast(Quantized, parts)
        group_size, bits = _quantization(packed, scales, dim)
        return mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits)
    return [(one(keys), one(values)) for keys, values in segments]


def batch_attention(valid: mx.array, quantized: bool, scale: float = 1.0) -> Attention:
    """Attention of one query per sequence of a batch over keys padded to a common length, in pieces, as
    ``attention_for`` gives it: decided once a step, for every layer.

    Its queries: (B, heads, 1, dim); its segments: (B, kv_heads, length, dim) keys and values each, in any
    order along the length (a decode step sees every key it holds); valid: (B, 1, 1, keys) booleans over
    the pieces' keys in order, False for padding.
    """
    profile = current()
    if profile.fused_attention and not quantized:
        def fused(q: mx.array, segments: list[Segment]) -> Attended:
            keys, values = segments[0]  # padded rows and their mask: what the fused kernel takes
            return mx.fast.scaled_dot_product_attention(q, cast(mx.array, keys), cast(mx.array, values), scale=scale,
                                                        mask=valid), None
        return fused
    return partial(_grouped, scale=scale, mask=valid, fast=profile.fast_exp)


def normalized(parts: Attended, shape: tuple[int, ...]) -> mx.array:
    """The attention (B, heads, L, dim) of ``attend_parts``' result, for queries of ``shape``."""
    out, total = parts
    if total is None:
        return out
    return _as(out / total, out.dtype).reshape(shape)


def _grouped(q: mx.array, segments: list[Segment], scale: float,
             mask: Callable[[mx.array], mx.array] | mx.array | None, fast: bool, final: bool = False) -> Attended:
    """Grouped-query softmax attention over ``segments``; ``mask`` maps float32 scores to masked scores, or is
    booleans broadcast against them (True: seen; a batch's padded rows), or None (every key is seen);
    ``final``: divided by the total here (``normalized``). One float segment, the common case, runs with
    no helper calls (they cost per layer)."""
    batch, heads, n, dim = q.shape
    keys, values = segments[0]
    kv_heads = (keys[0] if isinstance(keys, tuple) else keys).shape[1]
    rows = (q if scale == 1.0 else q * scale).reshape(batch, kv_heads, heads // kv_heads * n, dim)  # head h: kv h // rep
    if len(segments) == 1 and not isinstance(keys, tuple):
        scores = rows @ keys.swapaxes(-1, -2)  # (B, kv_heads, rep * L, length)
    else:
        pieces = [_scores(rows, keys) for keys, _ in segments]
        scores = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=-1)
    if scores.dtype != mx.float32:
        scores = scores.astype(mx.float32)
    if isinstance(mask, mx.array):
        scores = mx.where(mask, scores, -mx.inf)
    elif mask is not None:
        scores = mask(scores)
    values_dtype = values[1].dtype if isinstance(values, tuple) else values.dtype  # a quantized one's scales'
    if fast:
        p, bits = exp_below_parts()(scores, mx.max(scores, axis=-1, keepdims=True))  # ``fast_exp_below``'s two
        weights = p * bits.view(mx.float32)  # lines, inline: a call fewer per layer
        total = mx.sum(weights, axis=-1, keepdims=True)
    else:
        weights, total = mx.softmax(scores, axis=-1, precise=True), None
    if weights.dtype != values_dtype:
        weights = weights.astype(values_dtype)
    if len(segments) == 1:
        out = weights @ values if not isinstance(values, tuple) else _weighted(weights, values, dim)
    else:  # one split (not a slice per run); each run's product added to the sum in the same call
        ends = list(itertools.accumulate(_length(keys) for keys, _ in segments))[:-1]
        parts: list[mx.array] = mx.split(weights, ends, axis=-1)  # type: ignore[assignment]  # mlx's stub: a list
        out = _weighted(parts[0], segments[0][1], dim)
        for part, (_, values) in zip(parts[1:], segments[1:]):
            out = mx.addmm(out, part, values) if not isinstance(values, tuple) else out + _weighted(part, values, dim)
    if total is None:
        return out.reshape(batch, heads, n, dim), None
    if final:
        divided = out / total
        return (divided if divided.dtype == out.dtype else divided.astype(out.dtype)).reshape(batch, heads, n, dim), None
    return out, total


def _scores(rows: mx.array, keys: Part) -> mx.array:
    """rows (B, kv_heads, R, dim) times keys transposed: float (B, kv_heads, T, dim), or quantized per token
    (packed, scales, biases) read as they are stored (``kv_format.py``)."""
    if not isinstance(keys, tuple):
        return rows @ keys.swapaxes(-1, -2)
    packed, scales, biases = cast(Quantized, keys)
    group_size, bits = _quantization(packed, scales, rows.shape[-1])
    return mx.quantized_matmul(rows, packed, scales, biases, transpose=True, group_size=group_size, bits=bits)


def _weighted(weights: mx.array, values: Part, dim: int) -> mx.array:
    """weights (B, kv_heads, R, T) times values (T, dim), float or quantized per token."""
    if not isinstance(values, tuple):
        return weights @ values
    packed, scales, biases = cast(Quantized, values)
    group_size, bits = _quantization(packed, scales, dim)
    return mx.quantized_matmul(weights, packed, scales, biases, transpose=False, group_size=group_size, bits=bits)


def _quantization(packed: mx.array, scales: mx.array, dim: int) -> tuple[int, int]:
    """(group_size, bits) of quantized keys or values of head size ``dim``, read from their shapes."""
    return dim // scales.shape[-1], packed.shape[-1] * 32 // dim





def _keys_of(keys: Part) -> mx.array:
    return keys[0] if isinstance(keys, tuple) else keys


def _length(keys: Part) -> int:
    return _keys_of(keys).shape[2]


def _as(array: mx.array, dtype: mx.Dtype) -> mx.array:
    return array if array.dtype == dtype else array.astype(dtype)


def _joined(segments: Sequence[Segment]) -> Segment:
    if len(segments) == 1:
        return segments[0]
    return (mx.concatenate([cast(mx.array, k) for k, _ in segments], axis=2),
            mx.concatenate([cast(mx.array, v) for _, v in segments], axis=2))


def _scores_outgrow_cache(q: mx.array, segments: list[Segment]) -> bool:
    """Float32 queries whose scores for one kv head are more than ``cpu_attention``'s key block holds: a
    chunk of a prompt (verification blocks and short chunks make one block, read the same either way). The
    same rule as the paged cache's choice of runs over a span (``reads_spans``), so that key blocks get runs."""
    kv_heads = _keys_of(segments[0][0]).shape[1]
    rows = q.shape[1] // kv_heads * q.shape[2]
    return q.dtype == mx.float32 and q.shape[2] > 1 and not reads_spans(rows, sum(_length(k) for k, _ in segments))


def _scores_outweigh_keys(q: mx.array, segments: list[Segment]) -> bool:
    """Whether the grouped products' scores (a float per query row and key) would outweigh the keys and values
    themselves: then joining the runs (a copy of each once) for the fused kernel moves less memory (a prompt
    chunk over several runs; a decode step or a verification block reads them in place)."""
    kv_heads, dim = _keys_of(segments[0][0]).shape[1], q.shape[-1]
    return q.shape[1] * q.shape[2] > 2 * kv_heads * dim


def _grouped_mask_ok(mask: Mask) -> bool:
    """Masks the grouped path applies: none, causal, or one (L, keys) mask for every head."""
    return mask is None or isinstance(mask, str) and mask == "causal" or (
        isinstance(mask, mx.array) and all(size == 1 for size in mask.shape[:-2]))


def _masked(scores: mx.array, *, mask: mx.array, n: int) -> mx.array:
    """Apply ``mask`` (L, keys) to scores (B, kv_heads, rep * L, keys) whose rows are (query head, query) pairs."""
    kv_heads, rows, keys = scores.shape[1:]
    if n == 1 and mask.dtype == mx.bool_:  # one query: the (1, keys) row broadcasts over every head as it is
        return mx.where(mask, scores, -mx.inf)
    grouped = scores.reshape(-1, kv_heads, rows // n, n, keys)
    if mask.dtype == mx.bool_:
        grouped = mx.where(mask, grouped, -mx.inf)
    else:
        grouped = grouped + mask.astype(mx.float32)
    return grouped.reshape(-1, kv_heads, rows, keys)
