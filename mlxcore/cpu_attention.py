"""Causal attention for CPU prefill: blocks of keys whose scores stay in the CPU's cache.

MLX's CPU attention makes the whole (heads, queries, keys) score matrix and
runs softmax over it with MLX's exp (one element at a time on x86; docs/decisions.md).
Here each kv head's queries (its grouped query heads x the chunk's rows) meet
the keys a block at a time: a block's scores, one MiB at most, stay in cache
through softmax's passes, each key and value is read once per chunk, and the
blocks' partial softmaxes are combined exactly (rescaled to the overall row
maximum, as flash attention does). Only the last block, which holds the
chunk's own positions, needs the causal mask.

Blocking the query rows instead (the first version) left one query row per
block for 32 heads at 4k keys: every block read all keys and values again
(``bench/studies/cpu_attention.py`` has the figures).
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.device_profile import current
from mlxcore.kv.protocol import FloatSegment
from mlxcore.fast_exp import fast_exp

# Scores per block: 2**18 float32 (1 MiB), which stays in cache through softmax's passes: 512 keys at 32
# query heads over 8 kv heads, 1,024 at 16, 682 at the embedded 6 over 2. Block lengths against MLX's own
# attention (bench/studies/cpu_attention.py --keys): docs/decisions.md, "CPU attention: key blocks".
SCORES_PER_BLOCK = 1 << 18
MIN_KEYS_PER_BLOCK = 256  # with few queries per kv head: shorter blocks make the products inefficient
# Queries attended together: the default prefill chunk. Longer chunks go in passes of this many,
# each against only the keys it can see. Fewer than MIN_KEYS_PER_BLOCK, so every query sees at
# least one key of every block (no all-masked row).
QUERIES_PER_PASS = 128


def reads_spans(rows: int, keys: int) -> bool:
    """Whether ``rows`` query rows per kv head attend over ``keys`` keys of a paged sequence with its runs read
    as one span (a view over the slots between them, an array masking the gaps): on the GPU always (the fused
    kernel takes the mask); on the CPU only where the scores fit one key block, as a decode step's do: larger
    ones are read in key blocks, which mask causally over the runs as they lie."""
    return not current().fast_exp or rows * keys <= SCORES_PER_BLOCK


def segmented_causal_attention(q: mx.array, segments: list[FloatSegment], scale: float) -> mx.array:
    """Softmax attention of q (1, heads, L, dim) over keys and values held in pieces (a paged cache's runs of
    blocks; each (1, kv_heads, n, dim), grouped heads sharing a kv head), in order; (1, heads, L, dim). Query i
    sees keys up to S - L + i (the queries are the last L of S positions).

    Key blocks lie within one piece where they can; a block that straddles two pieces is joined (a copy of
    that block only), so blocks keep the widths the causal mask needs.
    """
    keys = _Keys(segments)
    n, s = q.shape[2], keys.length
    if n <= QUERIES_PER_PASS:
        return _attend(q, keys, s, scale)
    passes = []
    for first in range(0, n, QUERIES_PER_PASS):
        last = min(n, first + QUERIES_PER_PASS)
        seen = s - n + last  # keys the pass's last query sees
        passes.append(_attend(q[:, :, first:last], keys, seen, scale))
    return mx.concatenate(passes, axis=2)


class _Keys:
    """Keys and values in pieces, addressed by position as if they were one array."""

    def __init__(self, segments: list[FloatSegment]) -> None:
        self.segments, self.length = segments, 0
        self.starts: list[int] = []
        for k, _ in segments:
            self.starts.append(self.length)
            self.length += k.shape[2]

    def between(self, first: int, end: int, heads: slice[int, int, None]) -> FloatSegment:
        """Keys and values of positions ``first .. end`` for kv heads ``heads``: a view if one piece holds them."""
        pieces = [(k[:, heads, max(first - at, 0):end - at], v[:, heads, max(first - at, 0):end - at])
                  for (k, v), at in zip(self.segments, self.starts) if at < end and at + k.shape[2] > first]
        if len(pieces) == 1:
            return pieces[0]
        return mx.concatenate([k for k, _ in pieces], axis=2), mx.concatenate([v for _, v in pieces], axis=2)


def _attend(q: mx.array, keys: _Keys, s: int, scale: float) -> mx.array:
    """``segmented_causal_attention`` for at most ``QUERIES_PER_PASS`` queries over the first ``s`` keys."""
    b, heads, n, dim = q.shape
    kv_heads = keys.segments[0][0].shape[1]
    rows = heads // kv_heads * n  # queries that share one kv head
    q = (q * scale).reshape(b, kv_heads, rows, dim)
    width = max(MIN_KEYS_PER_BLOCK, SCORES_PER_BLOCK // rows)
    assert width >= n  # so the last block starts where every query sees a key (no all-masked row)
    # Short contexts: several kv heads' whole score matrices fit one block, fewer operations.
    together = max(1, SCORES_PER_BLOCK // (rows * s))
    outs = [_attend_heads(q[:, h:h + together], keys, slice(h, h + together), s, n, width)
            for h in range(0, kv_heads, together)]
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)
    return out.reshape(b, heads, n, dim)


def _attend_heads(q: mx.array, keys: _Keys, heads: slice[int, int, None], s: int, n: int, width: int) -> mx.array:
    """q: (1, c, rows, dim), already scaled, against the first ``s`` keys of kv heads ``heads``."""
    # Blocks counted back from the end, so the last one starts at S - width <= S - n (seen by every query);
    # the others end where a piece ends when one does, so that they are views.
    parts = [_block(q, *keys.between(a, e, heads), a, s, n) for a, e in _bounds(keys, s, width)]
    if len(parts) == 1:
        _, total, out = parts[0]
        return out / total
    tops, totals, outs = (mx.stack(list(x)) for x in zip(*parts))  # (blocks, 1, c, rows, 1 or dim)
    weights = fast_exp(tops - mx.max(tops, axis=0))  # each block's exps rescaled to the row's overall max
    return mx.sum(weights * outs, axis=0) / mx.sum(weights * totals, axis=0)


def _bounds(keys: _Keys, s: int, width: int) -> list[tuple[int, int]]:
    """Key blocks (first, end) covering 0 .. s, from the end: the last ``width`` wide, the others at most
    ``width`` and cut where a piece starts."""
    cuts = [at for at in keys.starts if 0 < at < s - width]
    bounds = [(max(0, s - width), s)]
    end = bounds[0][0]
    while end > 0:
        first = max([end - width] + [cut for cut in cuts if cut < end])
        bounds.append((first, end))
        end = first
    return bounds


def _block(q: mx.array, k: mx.array, v: mx.array, first: int, s: int, n: int
           ) -> tuple[mx.array, mx.array, mx.array]:
    """One key block (keys ``first``..): row maxima, row sums of exp(score - max), exp(...) @ v."""
    scores = q @ k.swapaxes(-1, -2)  # (1, c, rows, width)
    b, c, rows, width = scores.shape
    if first + width > s - n + 1:  # holds keys that some queries must not see yet
        visible = mx.arange(first, first + width)[None] <= mx.arange(n)[:, None] + (s - n)  # (n, width)
        grouped = scores.reshape(b, c, rows // n, n, width)  # rows are (query head, query) pairs
        scores = mx.where(visible, grouped, -mx.inf).reshape(b, c, rows, width)
    top = mx.max(scores, axis=-1, keepdims=True)
    exps = fast_exp(scores - top)
    return top, mx.sum(exps, axis=-1, keepdims=True), exps @ v
