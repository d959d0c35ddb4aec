"""A copy of a paged sequence held in a few runs of one slab: one row gather against the runs' slices joined.

Usage: .venv/bin/python bench/studies/runs_copy.py [--tokens 2000] [--rounds 5]
At the 8B's KV geometry (8 kv heads x 128), float32 and bfloat16, a sequence of ``--tokens`` tokens in 2, 3
and 4 runs of 16-token blocks with gaps between them: times ``LayerStorage.gather``'s row gather (one
``mx.take`` over the slab's rows, ``Gather.rows``) and the slices of the runs joined by ``mx.concatenate``
(what a copy of at most the profile's former ``max_runs`` runs took), alternating them; prints medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlxcore  # noqa: F401  (loads OpenBLAS before MLX)
import mlx.core as mx

from mlxcore.kv.slab_storage import Gather

BLOCK, SLAB_BLOCKS, KV_HEADS, HEAD_DIM = 16, 256, 8, 128


def timed(fn, repeat: int = 20) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        mx.eval(fn())
    return (time.perf_counter() - start) / repeat


def take(slab: mx.array, rows: mx.array) -> mx.array:
    """The row gather: one ``mx.take`` over the slab's (2 * kv_heads * slots, head_dim) rows."""
    return mx.take(slab.reshape(-1, HEAD_DIM), rows, axis=0)


def join(slab: mx.array, gather: Gather, tokens: int) -> mx.array:
    """The runs' slices joined along the token axis."""
    pieces, left = [], tokens
    for _, start, size in gather.runs:
        pieces.append(slab[:, :, start:start + min(size, left)])
        left -= size
    return mx.concatenate(pieces, axis=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    slots = SLAB_BLOCKS * BLOCK
    for dtype in (mx.float32, mx.bfloat16):
        slab = mx.random.normal((2, KV_HEADS, slots, HEAD_DIM)).astype(dtype)
        mx.eval(slab)
        for runs in (2, 3, 4):
            per_run = -(-args.tokens // (runs * BLOCK))
            gather = Gather([run * (per_run + 3) + i for run in range(runs) for i in range(per_run)], BLOCK,
                            SLAB_BLOCKS)
            rows = gather.rows(KV_HEADS, slots)[..., :args.tokens]
            ways = {"take": lambda: take(slab, rows), "join": lambda: join(slab, gather, args.tokens)}  # noqa: B023
            assert mx.array_equal(ways["take"](), ways["join"]()).item()
            times: dict[str, list[float]] = {"take": [], "join": []}
            for _ in range(args.rounds):
                for name, fn in ways.items():
                    times[name].append(timed(fn))
            take_ms, join_ms = (statistics.median(times[name]) * 1e3 for name in ("take", "join"))
            print(f"{dtype}, {runs} runs, {args.tokens} tokens: row gather {take_ms:.3f} ms, joined slices "
                  f"{join_ms:.3f} ms, gather / joined {take_ms / join_ms:.2f}")


if __name__ == "__main__":
    main()
