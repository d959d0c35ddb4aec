"""``GET /metrics``: the scheduler's state and the server's latencies, as Prometheus text.

The scheduler's figures are read from every loaded model's ``worker.stats()``
(thread-safe snapshots, summed by ``ModelRegistry.stats``) at each scrape, so
they are never stale; the latency histograms are
filled by the HTTP side as replies end, as the clients saw them. Each server has
its own registry (no process-global state, so tests can run several).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.serve.choices import ChoiceState
from mlxcore import WorkerStats

if TYPE_CHECKING:
    from app.serve.registry import ModelRegistry

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# WorkerStats field -> (metric name, help, counter?)
_FIELDS = {
    "waiting": ("mlxchat_queue_length", "requests waiting to be admitted (preempted ones included)", False),
    "running": ("mlxchat_running_requests", "requests prefilling or decoding", False),
    "finished": ("mlxchat_requests_finished", "requests that ended with eos, length or a stop string", True),
    "cancelled": ("mlxchat_requests_cancelled", "requests cancelled (clients that went away included)", True),
    "failed": ("mlxchat_requests_failed", "requests ended by an engine failure", True),
    "preemptions": ("mlxchat_preemptions", "times a running request's blocks were taken back", True),
    "generated_tokens": ("mlxchat_generated_tokens", "tokens generated, all requests", True),
    "prompt_tokens": ("mlxchat_prompt_tokens", "prompt tokens of admitted requests", True),
    "prefix_hit_tokens": ("mlxchat_prefix_hit_tokens", "prompt tokens found in the KV pool (not computed)", True),
    "tokens_per_second": ("mlxchat_tokens_per_second", "tokens generated per second, last few seconds", False),
    "mean_batch_size": ("mlxchat_mean_batch_size", "sequences per decode step, mean since start", False),
    "kv_bytes": ("mlxchat_kv_bytes", "KV memory the pools hold (target and draft)", False),
    "kv_budget_bytes": ("mlxchat_kv_budget_bytes", "the KV memory budget", False),
    "pool_used_blocks": ("mlxchat_pool_used_blocks", "target pool blocks some sequence holds", False),
    "pool_capacity_blocks": ("mlxchat_pool_capacity_blocks", "target pool blocks it may hand out", False),
}


class _SchedulerCollector:
    """Reads the loaded models' stats at each scrape."""

    def __init__(self, models: ModelRegistry, rank_weight_bytes: tuple[int, ...]) -> None:
        self._models, self._rank_weights = models, rank_weight_bytes
        self._stats: Callable[[], WorkerStats] = models.stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for name, (metric, text, counter) in _FIELDS.items():
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(metric, text, value=getattr(stats, name))
        yield GaugeMetricFamily("mlxchat_prefix_hit_rate", "prefix-hit tokens / prompt tokens since start",
                                value=stats.prefix_hit_rate)
        yield from _disk_tier_metrics()
        yield GaugeMetricFamily("mlxchat_engine_alive", "1 while the engine thread runs", value=int(self._models.alive()))
        budget = self._models.budget
        yield GaugeMetricFamily("mlxchat_kv_peak_bytes", "most KV memory the pools held at once (all models)",
                                value=budget.peak if budget else 0)
        loaded = GaugeMetricFamily("mlxchat_model_loaded", "1 for each model loaded now", labels=["model"])
        for served in self._models.loaded():
            loaded.add_metric([served.entry.id], 1)
        yield loaded
        yield GaugeMetricFamily("mlxchat_world_size", "ranks the model runs on (mlx.launch)",
                                value=max(len(self._rank_weights), 1))
        weights = GaugeMetricFamily("mlxchat_rank_weight_bytes", "bytes of the target's weights each rank holds",
                                    labels=["rank"])
        for rank, size in enumerate(self._rank_weights):
            weights.add_metric([str(rank)], size)
        yield weights


def _disk_tier_metrics() -> Iterator[Metric]:
    """The disk tier under the pools (``--disk-kv``): its hits apart from the pool's own (memory's are
    ``mlxchat_prefix_hit_tokens`` less these), its size, and whether it still writes."""
    from mlxcore import disk_tiers

    tiers = disk_tiers()
    yield CounterMetricFamily("mlxchat_prefix_disk_hit_tokens", "prompt tokens read back from the KV disk tier "
                              "(not computed; counted in mlxchat_prefix_hit_tokens too)",
                              value=sum(tier.hit_tokens for tier in tiers))
    yield GaugeMetricFamily("mlxchat_disk_kv_bytes", "bytes of KV blocks on disk", value=sum(t.bytes for t in tiers))
    yield GaugeMetricFamily("mlxchat_disk_kv_writing", "1 while the disk tier writes (0: off, or its disk is full)",
                            value=int(any(tier.stopped is None for tier in tiers)))


class ServerMetrics:
    """The registry ``/metrics`` shows, and what the HTTP side observes into it."""

    def __init__(self, models: ModelRegistry, rank_weight_bytes: tuple[int, ...] = ()) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_SchedulerCollector(models, rank_weight_bytes))
        self.ttft = Histogram("mlxchat_time_to_first_token_seconds", "from request to first token, as sent",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.inter_token = Histogram("mlxchat_inter_token_seconds", "gap between two tokens of one choice",
                                     buckets=GAP_BUCKETS, registry=self.registry)
        self.duration = Histogram("mlxchat_request_duration_seconds", "from request to last byte",
                                  ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.requests = Counter("mlxchat_http_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)

    def observe_reply(self, ttft: float | None, choices: list[ChoiceState]) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
        for choice in choices:
            for before, after in zip(choice.arrivals, choice.arrivals[1:]):
                self.inter_token.observe(after - before)

    def observe_http(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.duration.labels(endpoint).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)
