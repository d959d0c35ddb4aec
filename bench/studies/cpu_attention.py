"""CPU prefill's attention for one chunk of 128 queries: key blocks, the old query-row blocks, MLX's own.

Usage: .venv/bin/python bench/studies/cpu_attention.py [--keys 256,512,1024] [--runs 3]
           [--geometries 32/8/128,6/2/32] [--contexts 512,4096]
For each geometry (query heads / KV heads / head size: the 8B twin's, the 0.6B twin's, the
embedded target's) and context length, times ``mlxcore.cpu_attention.segmented_causal_attention``, the
query-row blocking it replaced (below, as it was), and ``mx.fast.scaled_dot_product_attention``
(what mlx-lm's model runs), alternating them; prints medians in ms. ``--keys`` also times fixed
key-block lengths, the measurement that chose ``SCORES_PER_BLOCK``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlxcore  # noqa: F401  (loads OpenBLAS before MLX)
import mlx.core as mx

import mlxcore.cpu_attention as cpu_attention
from mlxcore.blas import parallel_products
from mlxcore.fast_exp import fast_softmax, warm_up

GEOMETRIES = ((32, 8, 128), (16, 8, 128), (6, 2, 32))
CONTEXTS = (512, 1024, 2048, 4096, 8192)
QUERIES = 128


def row_blocks(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """The replaced blocking: query rows whose scores against all keys, all heads, fill 2**17 floats."""
    b, heads, n, dim = q.shape
    kv_heads, s = k.shape[1], k.shape[2]
    rows = max(1, (1 << 17) // (heads * s))
    outs = []
    for first in range(0, n, rows):
        part = q[:, :, first:first + rows]
        r = part.shape[2]
        part = (part * scale).reshape(b, kv_heads, heads // kv_heads * r, dim)
        scores = (part @ k.swapaxes(-1, -2)).reshape(b, kv_heads, heads // kv_heads, r, s)
        visible = mx.arange(s)[None] <= mx.arange(first, first + r)[:, None] + (s - n)
        weights = fast_softmax(mx.where(visible, scores, -mx.inf)).reshape(b, kv_heads, -1, s)
        outs.append((weights @ v).reshape(b, heads, r, dim))
    return mx.concatenate(outs, axis=2)


def with_keys(keys: int, rows: int):
    """``segmented_causal_attention`` with key blocks of ``keys`` keys (for ``rows`` queries per KV head)."""
    def attend(q, k, v, scale):
        saved = cpu_attention.SCORES_PER_BLOCK
        cpu_attention.SCORES_PER_BLOCK = keys * rows
        try:
            return cpu_attention.segmented_causal_attention(q, [(k, v)], scale)
        finally:
            cpu_attention.SCORES_PER_BLOCK = saved
    return attend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", default="", help="comma-separated fixed key-block lengths to time too")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--geometries", default=",".join("/".join(map(str, g)) for g in GEOMETRIES),
                        help="query heads/KV heads/head size, comma-separated")
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="key counts, comma-separated")
    args = parser.parse_args()
    geometries = [tuple(int(x) for x in g.split("/")) for g in args.geometries.split(",")]
    contexts = [int(s) for s in args.contexts.split(",")]
    warm_up()
    with parallel_products():  # as prefill runs
        for heads, kv_heads, dim in geometries:
            for s in contexts:
                q = mx.random.normal((1, heads, QUERIES, dim))
                k, v = mx.random.normal((1, kv_heads, s, dim)), mx.random.normal((1, kv_heads, s, dim))
                ways = {"key blocks": lambda q, k, v, scale: cpu_attention.segmented_causal_attention(q, [(k, v)], scale),
                        "row blocks": row_blocks,
                        "mlx": lambda q, k, v, scale: mx.fast.scaled_dot_product_attention(
                            q, k, v, scale=scale, mask="causal")}
                for keys in filter(None, args.keys.split(",")):
                    ways[f"keys={keys}"] = with_keys(int(keys), heads // kv_heads * QUERIES)
                print(f"{heads}/{kv_heads}/{dim} {s:5d} keys: " + _timed(ways, q, k, v, dim ** -0.5, args.runs),
                      flush=True)


def _timed(ways: dict, q, k, v, scale: float, runs: int) -> str:
    mx.eval(q, k, v)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for run in range(runs + 1):  # the first round warms up
        for name in (list(ways) if run % 2 else list(ways)[::-1]):
            start = time.perf_counter()
            mx.eval(ways[name](q, k, v, scale))
            if run:
                seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(s) * 1e3 for name, s in seconds.items()}
    mlx = medians["mlx"]
    return "  ".join(f"{name} {ms:7.1f} ms ({ms / mlx:.2f})" for name, ms in medians.items())


if __name__ == "__main__":
    main()
