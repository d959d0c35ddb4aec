"""``BatchWorker``: the engine loop on this (main) thread, clients on threads of their own."""

from __future__ import annotations

import threading
import time

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import pytest

from mlxcore.batching.errors import OverloadedError, PromptTooLongError
from mlxcore.batching.handle import RequestFailedError
from mlxcore.batching.request import Request
from mlxcore.batching.worker import MAX_FAILED_STEPS, BatchWorker
from bench.batch_load import stream_prompt
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams

TARGET = load_model("mini-target")


def make_worker(**options) -> BatchWorker:
    engine = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged"))
    engine.eos_ids = set()
    return BatchWorker(engine, **options)


def serve(worker: BatchWorker, client) -> dict:
    """Run ``client(worker, result)`` on a thread while this thread runs the engine; the client closes it."""
    result: dict = {}

    def run_client() -> None:
        try:
            client(worker, result)
        except BaseException as error:  # reported to the test below
            result["error"] = error
        finally:
            worker.close()

    thread = threading.Thread(target=run_client)
    thread.start()
    try:
        worker.run()
    except RuntimeError as error:
        result["engine_error"] = error
    thread.join(timeout=60)
    if "error" in result:
        raise result["error"]
    return result


def test_requests_from_threads_stream_their_own_tokens():
    def client(worker, result):
        params = GenerationParams(max_tokens=20)
        handles = [worker.submit(Request(tuple(stream_prompt(2048, s, 30 + s)), params)) for s in range(4)]
        result["streams"] = [[e for e in h.events(timeout=60)] for h in handles]
        result["stats"] = worker.stats()

    result = serve(make_worker(), client)
    for events in result["streams"]:
        assert sum(isinstance(e, TokenEvent) for e in events) == 20 and isinstance(events[-1], FinalEvent)
    assert result["stats"].finished == 4 and result["stats"].generated_tokens == 80


def test_call_runs_on_the_engine_thread_between_steps():
    def client(worker, result):
        result["thread"] = worker.call(lambda engine: threading.current_thread().name)

    assert serve(make_worker(), client)["thread"] == threading.main_thread().name


def test_a_closed_worker_refuses_new_requests():
    def client(worker, result):
        worker.close()  # the loop stops taking work: what is submitted now only waits
        params = GenerationParams(max_tokens=5)
        with pytest.raises(RequestFailedError):
            worker.submit(Request((1, 2, 3), params))
        result["ok"] = True

    assert serve(make_worker(max_waiting=1), client)["ok"]


def test_overload_when_more_are_waiting_than_allowed():
    worker = make_worker(max_waiting=2)
    params = GenerationParams(max_tokens=5)
    worker.submit(Request((1, 2, 3), params))  # not running yet: these wait in the inbox
    worker.submit(Request((1, 2, 3), params))
    with pytest.raises(OverloadedError) as refused:
        worker.submit(Request((1, 2, 3), params))
    assert refused.value.retry_after >= 1


def test_a_prompt_longer_than_the_context_fails_its_stream_only():
    def client(worker, result):
        too_long = worker.submit(Request(tuple([5] * 5000), GenerationParams(max_tokens=3)))
        fine = worker.submit(Request((1, 2, 3), GenerationParams(max_tokens=3)))
        with pytest.raises(RequestFailedError) as failed:
            list(too_long.events(timeout=30))
        result["cause"] = failed.value.__cause__
        result["fine"] = list(fine.events(timeout=30))

    result = serve(make_worker(), client)
    assert isinstance(result["cause"], PromptTooLongError) and "context" in str(result["cause"])
    assert isinstance(result["fine"][-1], FinalEvent)


def failing_from(worker: BatchWorker, monkeypatch, first: int, last: int | None) -> None:
    """Steps ``first`` to ``last`` (None: all after ``first``) of ``worker`` raise, as a failing pass would."""
    steps = {"n": 0}
    real_step = worker.runner.step

    def failing_step():
        steps["n"] += 1
        if steps["n"] >= first and (last is None or steps["n"] <= last):
            raise RuntimeError("the GPU fell off")
        real_step()

    monkeypatch.setattr(worker.runner, "step", failing_step)


def test_a_failing_step_ends_its_requests_and_the_engine_goes_on(monkeypatch):
    worker = make_worker()
    failing_from(worker, monkeypatch, 3, 3)

    def client(worker, result):
        handle = worker.submit(Request((1, 2, 3), GenerationParams(max_tokens=50)))
        with pytest.raises(RequestFailedError, match="the GPU fell off"):
            list(handle.events(timeout=30))
        result["alive"] = worker.alive
        result["next"] = list(worker.submit(Request((1, 2, 3), GenerationParams(max_tokens=5))).events(timeout=30))
        # The engine thread snapshots its stats after the step that sent the final event: wait for that snapshot
        deadline = time.monotonic() + 30
        while worker.stats().running and time.monotonic() < deadline:
            time.sleep(0.01)
        result["stats"] = worker.stats()

    result = serve(worker, client)
    assert result["alive"] is True and worker.failure is None
    assert result["next"][-1].finish_reason == "length" and len(result["next"]) == 6
    assert result["stats"].failed == 1 and result["stats"].running == 0


def test_steps_failing_in_a_row_stop_the_engine_and_refuse_new_requests(monkeypatch):
    worker = make_worker()
    failing_from(worker, monkeypatch, 3, None)

    def client(worker, result):
        result["failed_requests"] = 0
        while worker.alive and result["failed_requests"] < MAX_FAILED_STEPS:
            handle = worker.submit(Request((1, 2, 3), GenerationParams(max_tokens=50)))
            with pytest.raises(RequestFailedError, match="the GPU fell off"):
                list(handle.events(timeout=30))
            result["failed_requests"] += 1
            result.setdefault("alive_after_first", worker.alive)
        for _ in range(3000):  # the last failure stops the loop just after the request hears it
            if not worker.alive:
                break
            time.sleep(0.01)
        result["alive"] = worker.alive
        with pytest.raises(RequestFailedError):
            worker.submit(Request((1, 2, 3), GenerationParams(max_tokens=5)))
        result["stats"] = worker.stats()

    result = serve(worker, client)
    assert result["alive"] is False and "the GPU fell off" in str(result["engine_error"])
    assert isinstance(worker.failure, RuntimeError)
    assert result["alive_after_first"] is True and result["failed_requests"] <= MAX_FAILED_STEPS
    assert result["stats"].failed == result["failed_requests"] and result["stats"].running == 0


def test_cancel_from_another_thread_ends_the_stream():
    def client(worker, result):
        handle = worker.submit(Request((1, 2, 3), GenerationParams(max_tokens=10_000)))
        events = handle.events(timeout=30)
        for count, event in enumerate(events):
            if count == 5:
                handle.cancel()
            if isinstance(event, FinalEvent):
                result["final"] = event
        result["stats"] = worker.stats()

    result = serve(make_worker(), client)
    assert result["final"].finish_reason == "cancelled" and result["final"].stats.generated_tokens < 100


def failure_cause(engine: Engine, request: Request) -> BaseException:
    """Why ``request`` failed on a worker of ``engine`` (it must fail)."""
    def client(worker, result):
        handle = worker.submit(request)
        with pytest.raises(RequestFailedError) as failed:
            list(handle.events(timeout=30))
        result["cause"] = failed.value.__cause__

    return serve(BatchWorker(engine), client)["cause"]


def test_a_prompt_over_the_whole_kv_budget_fails_at_once():
    engine = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged", max_kv_bytes=200_000))
    cause = failure_cause(engine, Request(tuple([5] * 1500), GenerationParams(max_tokens=3)))
    assert isinstance(cause, PromptTooLongError) and "KV cache memory is full" in str(cause) and "budget" in str(cause)


def test_a_prompt_that_others_keep_out_fails_with_retry_later_instead_of_waiting():
    engine = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged", max_kv_bytes=600_000))
    holder = engine.new_caches()  # a chat outside the scheduler holding most of the budget
    holder.target.begin(149)
    mx.eval(engine.model(mx.array([list(range(1, 150))]), cache=holder.target.layers))
    cause = failure_cause(engine, Request(tuple([5] * 100), GenerationParams(max_tokens=3)))
    assert isinstance(cause, OverloadedError) and cause.retry_after > 0
