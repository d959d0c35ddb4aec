"""Row ``tp2_decode_vs_single``: plain decode tok/s of the model split over 2 ring ranks / the model in one process.

Both sides are real processes running ``tp_probe`` (2 ranks through ``mlx.launch``
on 127.0.0.1), taking turns, each reporting the median of its own replies. On
one 2-core machine the two ranks share the cores and talk over loopback, so the
ratio measures what splitting costs (a collective per attention and per MLP, each
step), not what two machines gain. The per-step communication time beside it is
2 x layers x the measured latency of one ``all_sum`` of a token's hidden vector.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from mlxcore.distributed.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
PROBE_TIMEOUT_S = 600


def tp2_decode_vs_single(model: str, runs: int, tokens: int = 128) -> dict:
    single, split, ratios = [], [], []
    for run in range(runs):
        sides = ((1, single), (2, split)) if run % 2 == 0 else ((2, split), (1, single))  # who goes first alternates
        for ranks, figures in sides:
            figures.append(_probe(model, tokens, ranks))
        ratios.append(split[-1]["tps"] / single[-1]["tps"])
    comm = statistics.median(f["all_sum_seconds"] for f in split) * 2 * split[0]["layers"]
    split_tps = statistics.median(f["tps"] for f in split)
    return {"value": statistics.median(ratios), "ratios": ratios, "tp2_tps": split_tps,
            "single_tps": statistics.median(f["tps"] for f in single),
            "comm_ms_per_step": comm * 1e3, "comm_share_of_step": comm * split_tps,
            "tokens": tokens, "model": model, "machine_cores": os.cpu_count()}


def _probe(model: str, tokens: int, ranks: int) -> dict:
    probe = [sys.executable, "-m", "mlxcore.bench.tp_probe", model, str(tokens), "3"]
    if ranks > 1:
        launcher = str(Path(sys.executable).parent / "mlx.launch")
        probe = [launcher, "-n", str(ranks), "--backend", "ring", "-p", str(free_ports(ranks)), "--", *probe]
    done = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if done.returncode != 0:
        raise RuntimeError(f"the {ranks}-rank probe failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
