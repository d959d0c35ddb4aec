"""Replies run side by side in one batch on the caller's thread (``LocalBatch``), each reply's events kept apart:
for the rows and tests that compare a batch with the same requests one at a time."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.engine import Engine
from mlxcore.events import Event
from mlxcore.params import GenerationParams


def side_by_side(engine: Engine, prompts: Sequence[Sequence[int]], params: GenerationParams, *,
                 max_running: int = 8) -> tuple[LocalBatch, list[list[Event]]]:
    """The replies to ``prompts``, at most ``max_running`` at once, run to their ends: the batch (its runner's
    tally and drafter, for the caller to inspect), and each reply's events in the order of ``prompts``."""
    batch = LocalBatch(engine, max_running=max_running)
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    events: dict[str, list[Event]] = {h.request_id: [] for h in handles}
    while batch.busy:
        batch.step()
        for h in handles:
            events[h.request_id].extend(drain(h))
    for h in handles:  # what the last step left
        events[h.request_id].extend(drain(h))
    return batch, [events[h.request_id] for h in handles]
