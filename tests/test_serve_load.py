"""The bounded load test: concurrency 1, 2, 4 and 8, 32 streaming requests each, on loopback, ending by itself.

Every request must complete, the figures must be real numbers, batching must
show (8 clients get more tokens per second than 2, the server without a drafter: speculation
speeds up 2 clients more than 8, and the figure is batching's), and the server must log one
line per request. The table is printed (pytest -s shows it); docs/benchmarks.md's comes from
``python -m bench.serve_load`` against ``mlxchat serve`` (its Server section).
"""

from __future__ import annotations

import math
import time

import pytest

from bench.serve_load import LoadSpec, run_load, table
from serve_process import MODEL, ServeProcess, poll_until

LEVELS = (1, 2, 4, 8)
REQUESTS = 32
BOUND_S = 240  # the whole test, however slow the host: every request has its own timeout too

pytestmark = pytest.mark.slow


def test_bounded_load(tmp_path):
    start = time.monotonic()
    with ServeProcess(tmp_path, pair=("--model", MODEL, "--no-draft")) as server:  # batching alone, no drafting
        results = [run_load(LoadSpec(server.url, MODEL, concurrency=c, requests=REQUESTS, max_tokens=64,
                                     timeout=60)) for c in LEVELS]
        # A request's line is written once its stream has ended, which can be just after the client has read it.
        poll_until(lambda: server.log().count(" POST /v1/chat/completions ") >= REQUESTS * len(LEVELS), limit=10)
        log = server.log()
    print("\n" + table(results))
    assert time.monotonic() - start < BOUND_S
    for result in results:
        assert result.requests == REQUESTS and result.failed == 0, result
        figures = (result.requests_per_second, result.output_tokens_per_second, result.ttft_p50, result.ttft_p99,
                   result.inter_token_p99)
        assert all(math.isfinite(x) and x > 0 for x in figures), result
        assert result.ttft_p50 <= result.ttft_p99
    by_level = {r.concurrency: r for r in results}
    assert by_level[8].output_tokens_per_second > 1.3 * by_level[2].output_tokens_per_second, "batching pays"
    lines = [line for line in log.splitlines() if "POST /v1/chat/completions 200" in line]
    assert len(lines) == REQUESTS * len(LEVELS), "one log line per request"
    assert all("prompt=" in line and "completion=" in line and "ttft=" in line for line in lines)
    assert "warning" not in log, "serving on loopback needs no API key"
