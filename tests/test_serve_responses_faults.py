"""The Responses API when things go wrong: a client that leaves, an engine that fails mid-stream. A real
server whose steps are slowed (tests/serve_slow_server.py), as in test_serve_anthropic_faults.py, so that a
reply is still under way when the test acts: the target decodes alone (``--no-draft``, a token a step; a
speculative round emits several) and replies run to their cap (``MLXCHAT_TEST_IGNORE_EOS``).
"""

from __future__ import annotations

import pytest

from serve_process import MODEL, ServeProcess, assert_freed_after_close, inject_fault

QUESTION = "What is 347 + 589?"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-responses-faults")
    fault = tmp / "fail-now"
    with ServeProcess(tmp, "--max-running", "1", pair=("--model", MODEL, "--no-draft"), script="serve_slow_server.py",
                      env={"MLXCHAT_TEST_STEP_SECONDS": "0.05", "MLXCHAT_TEST_FAULT_FILE": str(fault),
                           "MLXCHAT_TEST_IGNORE_EOS": "1"}) as server:  # replies run to their cap: under way
        yield server, fault


def test_closing_a_stream_cancels_it_and_frees_its_blocks(slow):
    server, _ = slow
    before = server.metrics()
    stream = server.client().responses.create(model=MODEL, input=QUESTION, max_output_tokens=500, stream=True)
    deltas = 0
    for event in stream:
        deltas += event.type.endswith(".delta")
        if deltas == 5:
            break
    assert server.metrics()["mlxchat_pool_used_blocks"] > before["mlxchat_pool_used_blocks"], "it holds blocks"
    stream.close()
    assert_freed_after_close(server, before)


def test_an_engine_failure_mid_stream_is_an_error_event(slow):
    server, fault = slow
    events = iter(server.client().responses.create(model=MODEL, input=QUESTION, max_output_tokens=500, stream=True))
    assert next(events).type == "response.created"
    inject_fault(server, fault, "once")
    rest = list(events)
    assert rest[-1].type == "error" and rest[-1].code == "engine_failed", rest[-1]
    assert "injected engine fault" in rest[-1].message
    assert not any(e.type == "response.completed" for e in rest)
    numbers = [e.sequence_number for e in rest]
    assert numbers == list(range(1, len(rest) + 1))
