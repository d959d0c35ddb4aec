"""The engine failing while requests run: 500 for them (an error event for a stream). One failing step ends
the requests it ran and the engine goes on; steps that keep failing stop it: /health 503, and the process
stays up to say so; new requests get 503. The fault is injected in a real worker's step
(tests/serve_slow_server.py), as an exception from MLX would come.
"""

from __future__ import annotations

import threading

import openai
import pytest

from mlxcore.batching.worker import MAX_FAILED_STEPS
from serve_process import MODEL, ServeProcess, assert_still_serves, http, inject_fault, normal_reply, poll_until

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]

pytestmark = pytest.mark.slow


def fail_two_in_flight(server: ServeProcess, fault, content: str) -> None:
    """A stream and a whole request run; the fault file is written; both must fail with the injected fault."""
    client = server.client()
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, max_tokens=500)
    next(stream)
    caught: list[BaseException] = []

    def wait_whole() -> None:
        try:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=500)
        except openai.APIStatusError as error:
            caught.append(error)

    waiting = threading.Thread(target=wait_whole)
    waiting.start()
    inject_fault(server, fault, content, running=2)
    with pytest.raises(openai.APIError) as streamed:
        for _ in stream:
            pass
    assert "injected engine fault" in str(streamed.value)
    waiting.join(timeout=30)
    assert caught and caught[0].status_code == 500 and "injected engine fault" in caught[0].body["message"]


def test_one_failing_step_fails_its_requests_and_the_engine_goes_on(tmp_path):
    fault = tmp_path / "fail-now"
    with ServeProcess(tmp_path, script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.05", "MLXCHAT_TEST_FAULT_FILE": str(fault)}) as server:
        reference = normal_reply(server)
        fail_two_in_flight(server, fault, "once")
        metrics = server.metrics()
        assert metrics["mlxchat_requests_failed_total"] == 2 and metrics["mlxchat_engine_alive"] == 1
        assert_still_serves(server, reference)


def test_steps_that_keep_failing_stop_the_engine_and_health_says_so(tmp_path):
    fault = tmp_path / "fail-now"
    with ServeProcess(tmp_path, script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.05", "MLXCHAT_TEST_FAULT_FILE": str(fault)}) as server:
        client = server.client()
        fail_two_in_flight(server, fault, "always")
        for _ in range(MAX_FAILED_STEPS):  # each request's step fails, until the engine gives up
            if http("GET", f"{server.url}/health")[0] == 503:
                break
            with pytest.raises(openai.APIStatusError) as failed:
                client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5)
            assert failed.value.status_code in (500, 503), failed.value.body
        status, _, health = http("GET", f"{server.url}/health")
        assert status == 503 and "injected engine fault" in health["error"]
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model=MODEL, messages=QUESTION)
        assert refused.value.status_code == 503 and "engine has stopped" in refused.value.body["message"]
        metrics = server.metrics()
        assert metrics["mlxchat_engine_alive"] == 0 and metrics["mlxchat_running_requests"] == 0
        assert metrics["mlxchat_requests_failed_total"] >= 2
        assert server.process.poll() is None, "the process stays up, so that /health tells the truth"


def test_sigterm_ends_streams_with_a_finish_reason_and_waiting_requests_with_an_error(tmp_path):
    with ServeProcess(tmp_path, script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.02", "MLXCHAT_TEST_IGNORE_EOS": "1"}) as server:
        client = server.client()
        stream = client.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, max_tokens=3000)
        next(stream)
        caught: list[BaseException] = []

        def wait_whole() -> None:
            try:
                client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3000)
            except openai.APIStatusError as error:
                caught.append(error)

        waiting = threading.Thread(target=wait_whole)
        waiting.start()
        poll_until(lambda: server.metrics()["mlxchat_running_requests"] == 2)
        server.process.terminate()
        chunks = list(stream)  # the SDK ends the iteration at [DONE]; a cut connection would raise instead
        waiting.join(timeout=60)
        assert chunks and chunks[-1].choices[0].finish_reason == "cancelled"
        assert caught and caught[0].status_code == 503, caught
        assert caught[0].body["code"] == "server_shutting_down", caught[0].body
        assert server.process.wait(timeout=60) == 0
