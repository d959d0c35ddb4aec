"""A bounded load test of an OpenAI-compatible server: streaming chat requests at a fixed concurrency.

``run_load`` sends ``requests`` requests from ``concurrency`` client threads (each
sends its next request when the last one ended) and reports requests/s, output
tokens/s, time to first token (p50, p99) and the inter-token gap (p99), as the
clients saw them. It ends by itself: a fixed number of requests, each with a
timeout. Plain ``http.client`` (no dependency beyond Python), so it measures
any server the same way: ``mlxchat serve`` and ``mlx_lm.server`` in the bench.

    python -m bench.serve_load --url http://127.0.0.1:8080 --model mini-target --concurrency 1,2,4,8
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np

QUESTIONS = (  # the bench's questions (bench.prompts), without importing MLX here
    "What is 347 + 589?", "Reverse the word lantern.", "How many meters are in 7 kilometers?",
    "Sort these numbers: 42, 7, 19, 88, 3.", "What is 63 - 28?", "Write the word orchard in upper case.",
    "How many letters r are in the word strawberry?", "What is 12 times 9?",
)


@dataclass(frozen=True)
class LoadSpec:
    """What to send: to which server, how many requests, how many at once."""

    url: str  # e.g. http://127.0.0.1:8080
    model: str  # the "model" field the server expects
    concurrency: int = 8
    requests: int = 32
    max_tokens: int = 128
    temperature: float = 0.0
    api_key: str | None = None
    timeout: float = 120.0  # seconds one request may take before it counts as failed


@dataclass
class StreamTiming:
    """One streamed request as the client saw it."""

    start: float
    token_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    tokens: int = 0  # completion tokens: the usage chunk's count, else the chunks with text
    error: str | None = None


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    requests: int
    failed: int
    seconds: float
    requests_per_second: float
    output_tokens_per_second: float
    ttft_p50: float
    ttft_p99: float
    inter_token_p99: float


def chat_body(spec: LoadSpec, index: int) -> dict:
    return {"model": spec.model, "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
            "max_tokens": spec.max_tokens, "temperature": spec.temperature, "stream": True,
            "stream_options": {"include_usage": True}}


def stream_one(spec: LoadSpec, body: dict) -> StreamTiming:
    """POST one streaming chat request and time its chunks."""
    url = urlparse(spec.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=spec.timeout)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {spec.api_key}"}
                                                      if spec.api_key else {})
    timing = StreamTiming(start=time.perf_counter())
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        reply = connection.getresponse()
        if reply.status != 200:
            timing.error = f"HTTP {reply.status}: {reply.read()[:200]!r}"
            return timing
        _read_events(reply, timing)
    except OSError as error:
        timing.error = f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    return timing


def _read_events(reply: http.client.HTTPResponse, timing: StreamTiming) -> None:
    counted = 0
    for raw in reply:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            timing.error = str(event["error"])
            return
        delta = (event.get("choices") or [{}])[0].get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            timing.token_times.append(time.perf_counter())
            counted += 1
        if event.get("usage"):
            timing.tokens = event["usage"]["completion_tokens"]
    timing.tokens = timing.tokens or counted


def run_load(spec: LoadSpec) -> LoadResult:
    """Send ``spec.requests`` requests, ``spec.concurrency`` at a time; the figures of the whole run."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=spec.concurrency) as pool:
        timings = list(pool.map(lambda i: stream_one(spec, chat_body(spec, i)), range(spec.requests)))
    return summarize(spec, timings, time.perf_counter() - start)


def summarize(spec: LoadSpec, timings: list[StreamTiming], seconds: float) -> LoadResult:
    done = [t for t in timings if t.error is None and t.token_times]
    ttfts = [t.token_times[0] - t.start for t in done]
    gaps = [b - a for t in done for a, b in zip(t.token_times, t.token_times[1:])]
    return LoadResult(concurrency=spec.concurrency, requests=len(timings), failed=len(timings) - len(done),
                      seconds=seconds, requests_per_second=len(done) / seconds,
                      output_tokens_per_second=sum(t.tokens for t in done) / seconds,
                      ttft_p50=_percentile(ttfts, 50), ttft_p99=_percentile(ttfts, 99),
                      inter_token_p99=_percentile(gaps, 99))


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def table(results: list[LoadResult]) -> str:
    """The results as a Markdown table (docs/benchmarks.md's)."""
    lines = ["| concurrency | requests | failed | req/s | output tok/s | TTFT p50 | TTFT p99 | inter-token p99 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.concurrency} | {r.requests} | {r.failed} | {r.requests_per_second:.2f} | "
                     f"{r.output_tokens_per_second:.0f} | {r.ttft_p50 * 1000:.0f} ms | {r.ttft_p99 * 1000:.0f} ms | "
                     f"{r.inter_token_p99 * 1000:.1f} ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Bounded load test of an OpenAI-compatible chat server.")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="mini-target")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument("--requests", type=int, default=32, help="requests per level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--api-key")
    args = parser.parse_args(argv)
    results = [run_load(LoadSpec(args.url, args.model, int(c), args.requests, args.max_tokens, api_key=args.api_key))
               for c in args.concurrency.split(",")]
    print(table(results))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
