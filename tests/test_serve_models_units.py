"""The model registry's bookkeeping without a server: keep_alive durations, leases, idle expiry, LRU order,
and totals that stay monotonic when a model is unloaded."""

from __future__ import annotations

import time

import pytest

from app.catalog import Catalog, ModelEntry
from app.serve.registry import ModelRegistry, ServedModel
from app.serve.settings import duration_seconds
from mlxcore.batching.stats import WorkerStats
from mlxcore.configs import ModelChoice


@pytest.mark.parametrize("value, seconds", [(300, 300.0), (0, 0.0), (-1, -1.0), ("90", 90.0), ("5m", 300.0),
                                            ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25), ("-1", -1.0)])
def test_keep_alive_durations_read_as_ollama_writes_them(value, seconds):
    assert duration_seconds(value) == seconds


@pytest.mark.parametrize("value", ["", "5 minutes", "m5", "5d", "1h 30m"])
def test_a_duration_that_is_not_one_says_so(value):
    with pytest.raises(ValueError, match="not a duration"):
        duration_seconds(value)


class FakeWorker:
    alive = True

    def __init__(self, finished: int, running: int = 0) -> None:
        self._stats = WorkerStats(finished=finished, running=running, steps=10, mean_batch_size=2.0)

    def stats(self) -> WorkerStats:
        return self._stats


def served(name: str, worker: FakeWorker, keep_alive: float | None = None) -> ServedModel:
    entry = ModelEntry(name, ModelChoice(model=name), "embedded")
    return ServedModel(entry, worker, info=None, tokens=None, sessions=None, keep_alive=keep_alive)


def registry() -> ModelRegistry:
    return ModelRegistry(Catalog(ModelEntry("a", ModelChoice(model="a"), "started")), max_models=2)


def test_a_leased_model_is_never_taken_out_and_expires_only_when_idle():
    models = registry()
    a = served("a", FakeWorker(1), keep_alive=0.0)
    models.add(a)  # leased for the request that asked for it
    assert models.expired(time.monotonic() + 10) == []
    assert not models.remove_if_idle(a, lambda: True)
    models.give(a)
    assert models.expired(time.monotonic() + 10) == [a]
    assert not models.remove_if_idle(a, lambda: False), "its worker still has a request"
    assert models.remove_if_idle(a, lambda: True) and models.loaded() == []


def test_a_model_stays_loaded_while_a_reply_on_it_is_being_sent():
    """keep_alive 0 (issue 63): a stream whose tokens are all made is still being sent; its model neither expires
    nor is taken out (so /health does not say it is gone) until the reply is sent, or dropped unsent."""

    class Reply:
        pass

    models = registry()
    a = served("a", FakeWorker(1), keep_alive=0.0)
    models.add(a)
    streaming, unsent = Reply(), Reply()
    models.sending(a, streaming)
    models.sending(a, unsent)
    models.give(a)
    assert models.expired(time.monotonic() + 10) == [] and not models.remove_if_idle(a, lambda: True)
    models.sent(a, streaming)
    del unsent  # a response that never started: nothing will call sent()
    assert models.expired(time.monotonic() + 10) == [a]
    assert models.remove_if_idle(a, lambda: True) and models.loaded() == []


def test_loaded_models_are_listed_least_recently_used_first():
    models = registry()
    for name in ("a", "b"):
        models.add(served(name, FakeWorker(0)))
        models.give(models.get(name))
    models.give(models.take("a"))
    assert [m.entry.id for m in models.loaded()] == ["b", "a"]


def test_totals_stay_monotonic_when_a_model_is_unloaded():
    models = registry()
    a, b = served("a", FakeWorker(finished=3, running=1)), served("b", FakeWorker(finished=4, running=2))
    for model in (a, b):
        models.add(model)
        models.give(model)
    both = models.stats()
    assert (both.finished, both.running, both.steps, both.mean_batch_size) == (7, 3, 20, 2.0)
    models.remove_if_idle(b, lambda: True)
    after = models.stats()
    assert (after.finished, after.running, after.steps) == (7, 1, 20)
