"""Bench rows of `mlxchat serve` (registered in ``bench.command.all_rows``).

- ``serve1_vs_ask``: decode tok/s of one streaming client through the server / `mlxchat ask`'s, same prompt, on
  the target alone (plain decoding: what the server adds, nothing else; with a draft, `ask` in a new process
  starts with an unlearned draft length while the server's has learned, and the ratio says that instead).
  The client's rate is (tokens - 1) / (time of the last text chunk - the first).
- ``serve8_throughput_vs_mlx_lm`` and ``serve8_ttft_p99_vs_mlx_lm``: 8 concurrent streaming clients, 64 requests,
  on `mlxchat serve` and on `mlx_lm.server` started on the same model folder (no draft for either: the same
  model, the same load); aggregate output tok/s (ours / theirs) and TTFT p99 (ours / theirs). One measurement
  serves both rows.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from functools import lru_cache

from bench.serve_load import LoadSpec, StreamTiming, run_load, stream_one
from bench.serve_processes import mlx_lm_server, mlxchat_server

ASK_PROMPT = "What is 12 times 9?"  # a long answer from the embedded pair (about 60 tokens, thinking on)
LOAD = dict(concurrency=8, requests=64, max_tokens=128)  # 64 requests: a run of ~4 s, steadier than 32


def client_decode_rate(timing: StreamTiming) -> float:
    times = timing.token_times
    if timing.error or len(times) < 2 or timing.tokens < 2:
        raise RuntimeError(f"a decode rate needs a reply of two tokens or more ({timing.error or 'too short'})")
    return (timing.tokens - 1) / (times[-1] - times[0])


def ask_decode_rate(model: str, draft: str | None) -> float:
    """`mlxchat ask --json` in a new process, as users run it: its decode tok/s."""
    pair = ["--model", model] + (["--draft", draft] if draft else ["--no-draft"])
    done = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--json", *pair, ASK_PROMPT],
                          capture_output=True, text=True, timeout=600, check=True)
    final = json.loads(done.stdout.strip().splitlines()[-1])
    return final["stats"]["decode_tps"]


def serve1_vs_ask(model: str, runs: int, draft: str | None = None, max_tokens: int = 512) -> dict:
    ratios, served, asked = [], [], []
    with mlxchat_server(model, draft) as server:
        spec = LoadSpec(server.url, server.model, concurrency=1, requests=1, max_tokens=max_tokens)
        body = {"model": server.model, "messages": [{"role": "user", "content": ASK_PROMPT}], "stream": True,
                "stream_options": {"include_usage": True}}
        client_decode_rate(stream_one(spec, body))  # warm up

        def served_rate() -> float:  # the median of three streams: one reply is ~60 tokens, ~0.15 s of decoding
            return statistics.median(client_decode_rate(stream_one(spec, body)) for _ in range(3))

        for i in range(runs):  # who goes first alternates
            if i % 2 == 0:
                served.append(served_rate())
                asked.append(ask_decode_rate(model, draft))
            else:
                asked.append(ask_decode_rate(model, draft))
                served.append(served_rate())
            ratios.append(served[-1] / asked[-1])
    return {"value": statistics.median(ratios), "ratios": ratios, "serve_tps": statistics.median(served),
            "ask_tps": statistics.median(asked), "model": model, "draft": draft, "prompt": ASK_PROMPT}


def serve8_vs_mlx_lm(model: str, runs: int, load: dict = LOAD) -> dict:
    """Paired load runs on both servers (they alternate who goes first); medians of the per-pair ratios."""
    return _serve8_pairs(model, runs, tuple(sorted(load.items())))


@lru_cache(maxsize=4)  # the two serve8 rows read the same runs
def _serve8_pairs(model: str, runs: int, load_items: tuple) -> dict:
    load = dict(load_items)
    from mlxcore.loading import resolve
    folder, _ = resolve(model)
    pairs = []
    with mlxchat_server(str(folder), None) as ours, mlx_lm_server(folder) as theirs:
        specs = {side: LoadSpec(server.url, server.model, **load) for side, server in
                 (("ours", ours), ("theirs", theirs))}
        for spec in specs.values():
            run_load(spec)  # warm up: compiled kernels, caches
        for i in range(runs):
            order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
            results = {}
            for side in order:
                results[side] = run_load(specs[side])
            pairs.append(results)
    return {"pairs": pairs, "model": model}


def _ratio_row(model: str, runs: int, field: str, load: dict) -> dict:
    pairs = serve8_vs_mlx_lm(model, runs, load)["pairs"]
    ours = [getattr(p["ours"], field) for p in pairs]
    theirs = [getattr(p["theirs"], field) for p in pairs]
    failed = sum(p[side].failed for p in pairs for side in p)
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {"value": statistics.median(ratios), "ratios": ratios, "ours": statistics.median(ours),
            "mlx_lm": statistics.median(theirs), "failed": failed, "model": model, **load}


def serve8_throughput_vs_mlx_lm(model: str, runs: int, load: dict = LOAD) -> dict:
    return _ratio_row(model, runs, "output_tokens_per_second", load)


def serve8_ttft_p99_vs_mlx_lm(model: str, runs: int, load: dict = LOAD) -> dict:
    return _ratio_row(model, runs, "ttft_p99", load)
