"""The engine failing while requests run: 500 for them (an error event for a stream), /health 503, and the
process stays up to say so; new requests get 503. The fault is injected in a real worker's step
(tests/serve_slow_server.py), as an exception from MLX would come.
"""

from __future__ import annotations

import threading

import openai
import pytest

from serve_process import MODEL, ServeProcess, http, poll_until

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]

pytestmark = pytest.mark.slow


def test_an_engine_failure_fails_requests_in_flight_and_health(tmp_path):
    fault = tmp_path / "fail-now"
    with ServeProcess(tmp_path, script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.05", "MLXCHAT_TEST_FAULT_FILE": str(fault)}) as server:
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
        poll_until(lambda: server.metrics()["mlxchat_running_requests"] == 2)
        fault.touch()
        with pytest.raises(openai.APIError) as streamed:
            for _ in stream:
                pass
        assert "injected engine fault" in str(streamed.value)
        waiting.join(timeout=30)
        assert caught and caught[0].status_code == 500 and "injected engine fault" in caught[0].body["message"]

        status, _, health = http("GET", f"{server.url}/health")
        assert status == 503 and "injected engine fault" in health["error"]
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model=MODEL, messages=QUESTION)
        assert refused.value.status_code == 503 and "engine has stopped" in refused.value.body["message"]
        assert server.metrics()["mlxchat_engine_alive"] == 0
        assert server.process.poll() is None, "the process stays up, so that /health tells the truth"
