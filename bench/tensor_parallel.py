"""Row ``tp2_decode_vs_single``: plain decode tok/s of the model split over 2 ring ranks / the model in one process.

Both sides are real processes running ``tp_probe`` (2 ranks over the ring on
127.0.0.1), taking turns, each reporting the median of its own replies. On
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
import tempfile
from pathlib import Path

from mlxcore.distributed.ports import local_hostfile

ROOT = Path(__file__).resolve().parents[1]
PROBE_TIMEOUT_S = 600


def tp2_row(model: str, runs: int, tokens: int = 128, twin_tokens: int = 48) -> dict:
    """The row on ``model`` (the embedded target), and the same on the float32 0.6B twin (Qwen3-0.6B's
    28 layers, 16 heads and 8 KV heads, its 151,936-token vocabulary): the value is the model's."""
    from bench.twins import twin_folder

    row = tp2_decode_vs_single(model, runs, tokens)
    twin = tp2_decode_vs_single(str(twin_folder("qwen3-0.6b", bits=None)), max(2, runs // 2), tokens=twin_tokens)
    return row | {f"twin_{key}": twin[key] for key in ("value", "ratios", "tp2_tps", "single_tps", "comm_ms_per_step",
                                                      "comm_share_of_step")}


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
    """Rank 0's figures. The ranks are started as ``mlx.launch`` starts them on one machine (MLX_RANK and a
    host file), not through it: its relay polls the ranks' pipes without blocking and would take one of
    this box's two cores."""
    command = [sys.executable, "-m", "bench.tp_probe", model, str(tokens), "3"]
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        if ranks > 1:
            env["MLX_HOSTFILE"] = str(local_hostfile(Path(folder) / "hosts.json", ranks))
        processes = [subprocess.Popen(command, cwd=ROOT, env=dict(env, MLX_RANK=str(rank)) if ranks > 1 else env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for rank in range(ranks)]
        outputs = [process.communicate(timeout=PROBE_TIMEOUT_S) for process in processes]
    failed = [(rank, p.returncode, err[-2000:]) for rank, (p, (_, err)) in enumerate(zip(processes, outputs))
              if p.returncode != 0]
    if failed:
        raise RuntimeError(f"the {ranks}-rank probe failed: {failed}")
    return json.loads(next(line for line in outputs[0][0].splitlines() if line.startswith("{")))
