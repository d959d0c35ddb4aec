"""Rows `spec_batch2_vs_plain` and `spec_batch8_vs_plain` (and `_twin`): speculative decoding inside the batch.

N streaming clients on `mlxchat serve` with the draft / the same load on a server without it, greedy: aggregate
output tok/s, paired runs alternating which server goes first, the median of the pairs' ratios. Both servers
run the same model folder in their own process; the one with the draft learns its draft lengths during the
warm-up (each batch size its own, ``DraftLengthController.for_rows``).
"""

from __future__ import annotations

import statistics

from bench.serve_load import LoadSpec, run_load
from bench.serve_processes import mlxchat_server
from bench.twins import twin_folder

TWIN_LOAD = dict(requests=4, max_tokens=24)  # the 8B twin in 4 bits decodes a few tokens a second on a CPU


def spec_batch_vs_plain(model: str, draft: str, runs: int, concurrency: int, requests: int | None = None,
                        max_tokens: int = 128) -> dict:
    requests = requests or 4 * concurrency
    with mlxchat_server(model, draft) as spec, mlxchat_server(model, None) as plain:
        loads = {side: LoadSpec(server.url, server.model, concurrency=concurrency, requests=requests,
                                max_tokens=max_tokens) for side, server in (("spec", spec), ("plain", plain))}
        for _ in range(2):  # warm up: compiled kernels; the draft lengths for this many replies
            for load in loads.values():
                run_load(load)
        rates: dict[str, list[float]] = {"spec": [], "plain": []}
        failed = 0
        for i in range(runs):
            for side in ("spec", "plain") if i % 2 == 0 else ("plain", "spec"):
                result = run_load(loads[side])
                rates[side].append(result.output_tokens_per_second)
                failed += result.failed
    ratios = [a / b for a, b in zip(rates["spec"], rates["plain"])]
    return {"value": statistics.median(ratios), "ratios": ratios, "spec_tps": statistics.median(rates["spec"]),
            "plain_tps": statistics.median(rates["plain"]), "failed": failed, "model": model, "draft": draft,
            "concurrency": concurrency, "requests": requests, "max_tokens": max_tokens}


def spec_batch_vs_plain_twin(runs: int, concurrency: int, requests: int, max_tokens: int) -> dict:
    """The same on the 8B twin with the 0.6B twin as draft, both 4-bit (random weights: the draft rarely
    agrees, so this says what drafting costs where it does not pay)."""
    return spec_batch_vs_plain(str(twin_folder("qwen3-8b")), str(twin_folder("qwen3-0.6b")), runs, concurrency,
                               requests, max_tokens)
