"""A batch step's token pick when its rows sample differently: one pick a kind of row against one a row.

Usage: .venv/bin/python bench/studies/mixed_pick.py [--rows 8] [--rounds 5]
Logits of Qwen3's vocabulary (151,936, bf16) for ``--rows`` rows: half greedy, the rest at Qwen3's
recommended sampling (temperature 0.6, top-k 20, top-p 0.95, each its own seed) but one with top-p alone.
Times ``decode_steps._pick`` (rows grouped by the graph they share) against each row's own sampler
(``TokenPicker``, what a batch whose rows did not all share one graph ran before), alternating them;
prints medians. Both give the same tokens. Then what one kind of row costs a row, alone and ``--rows`` together.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import mlxcore  # noqa: F401  (loads OpenBLAS before MLX)
import mlx.core as mx

from mlxcore.batching.decode_steps import _pick
from mlxcore.params import GenerationParams
from mlxcore.sampling import TokenPicker, warm_up

VOCAB = 151_936


def rows_params(rows: int) -> list[GenerationParams]:
    greedy = [GenerationParams(temperature=0.0)] * (rows // 2)
    sampled = [GenerationParams(temperature=0.6, top_k=20, top_p=0.95, seed=i) for i in range(rows - len(greedy) - 1)]
    return greedy + sampled + [GenerationParams(temperature=0.8, top_p=0.9, seed=99)]


def sequences(params: list[GenerationParams]) -> list[SimpleNamespace]:
    """What ``_pick`` reads of a sequence: its params and its sampler (whose keys it draws)."""
    return [SimpleNamespace(params=p, picker=TokenPicker(p, [])) for p in params]


def per_row(seqs, logits: mx.array) -> tuple[mx.array, mx.array]:
    picks = [seq.picker(logits[row:row + 1]) for row, seq in enumerate(seqs)]
    return mx.concatenate([t.reshape(1) for t, _ in picks]), mx.concatenate([lp.reshape(1) for _, lp in picks])


def timed(fn, params, logits: mx.array, repeat: int = 10) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        mx.eval(fn(sequences(params), logits))
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    params = rows_params(args.rows)
    logits = (mx.random.normal((args.rows, VOCAB)) * 4).astype(mx.bfloat16)
    warm_up(logits[:1])
    same = [mx.array_equal(a, b).item() for a, b in zip(_pick(sequences(params), logits),
                                                          per_row(sequences(params), logits))]
    assert all(same), "the grouped pick and each row's own sampler drew differently"
    times: dict[str, list[float]] = {"grouped": [], "per row": []}
    for _ in range(args.rounds):
        for name, fn in (("grouped", _pick), ("per row", per_row)):
            times[name].append(timed(fn, params, logits))
    grouped, own = (statistics.median(times[name]) * 1e3 for name in ("grouped", "per row"))
    print(f"{args.rows} rows at {VOCAB:,} tokens: grouped {grouped:.2f} ms, per row {own:.2f} ms, "
          f"grouped / per row {grouped / own:.2f}")
    kinds = {"greedy": params[0], "Qwen3's settings": params[-2], "top-p alone": params[-1]}
    for name, kind in kinds.items():
        costs = [timed(_pick, [kind] * rows, logits[:rows]) / rows * 1e3 for rows in (1, args.rows)]
        print(f"{name}: {costs[0]:.2f} ms a row alone, {costs[1]:.2f} ms a row in {args.rows}")


if __name__ == "__main__":
    main()
