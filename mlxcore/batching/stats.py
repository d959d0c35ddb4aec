"""A snapshot of the scheduler's state and totals, for ``/metrics`` and status lines (tensor-free)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerStats:
    """What the scheduler is doing now, and what it has done since it started."""

    waiting: int = 0  # requests queued, not yet admitted (preempted ones included)
    running: int = 0  # requests admitted: prefilling or decoding
    finished: int = 0  # requests that ended with eos, length or a stop string
    cancelled: int = 0  # requests cancelled by their caller (a client that went away, too)
    failed: int = 0  # requests ended by an engine failure
    preemptions: int = 0  # times a running request's blocks were taken back (it resumed by recompute)
    late: int = 0  # requests with a deadline that ended after it
    generated_tokens: int = 0  # tokens emitted, all requests
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    prefix_hit_tokens: int = 0  # of those, tokens found in the pool (not computed)
    tokens_per_second: float = 0.0  # emitted tokens per second over the last few seconds
    mean_batch_size: float = 0.0  # sequences per decode step, averaged over all steps so far
    steps: int = 0  # scheduler steps run
    kv_bytes: int = 0  # KV memory the pools hold now (both models)
    kv_budget_bytes: int = 0  # the KV memory budget
    pool_used_blocks: int = 0  # target pool: blocks some sequence holds
    pool_capacity_blocks: int = 0  # target pool: the most blocks it may hand out

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
