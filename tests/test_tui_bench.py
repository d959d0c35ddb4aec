"""The TUI benchmark: its autosaved chats stay out of the user's store; each side's figures are the engine's."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.tui import scratch_home
from sessions.store import default_root


def test_bench_sessions_stay_out_of_the_users_store(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "user"))
    with scratch_home() as folder:
        assert default_root() == Path(folder) / "sessions"
        assert not str(default_root()).startswith(str(tmp_path))
    assert default_root() == tmp_path / "user" / "sessions" and not Path(folder).exists()


def test_no_home_before_means_none_after(monkeypatch):
    monkeypatch.delenv("MLXCHAT_HOME", raising=False)
    with scratch_home() as folder:
        assert default_root() == Path(folder) / "sessions"
    assert "MLXCHAT_HOME" not in os.environ and "mlxchat-bench-" not in str(default_root())


def assert_decode_figures(row: dict, tokens: int, wall_seconds: float) -> None:
    """The row's tok/s is the engine's decode figure for a ``tokens``-token reply generated within the run.

    GenerationStats counts the tokens after the first over the time from the first to the last, so
    ``decode_tps`` is (tokens - 1) / ``decode_seconds``; a rate of another span (prefill, the whole run) or
    of another reply would not match it, and the decoding happened inside the run the test timed.
    """
    assert row["tokens"] == tokens
    assert 0 < row["decode_seconds"] < wall_seconds
    assert row["decode_tps"] == pytest.approx((tokens - 1) / row["decode_seconds"], rel=1e-9)


def timed(run):
    start = time.perf_counter()
    row = run()
    return row, time.perf_counter() - start


def test_each_side_runs_in_a_new_process_on_the_embedded_model(monkeypatch, tmp_path):
    from bench.tui import Workload, side_in_new_process

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    workload = Workload(draft=None, reply_tokens=24, earlier=4)
    headless, wall = timed(lambda: side_in_new_process("headless", workload))
    assert_decode_figures(headless, 24, wall)  # end-of-text ignored: the same length on both sides
    tui, wall = timed(lambda: side_in_new_process("process", workload))
    assert_decode_figures(tui, 24, wall)
    assert tui["mounted_messages"] == 4 + 2  # the earlier ones, the question, the reply
    assert 0 < tui["ui_cpu_share"] < 2
    assert 0 <= tui["lag_s"] < wall  # the reply is complete on screen after its last token, within the run


def test_control_run_generates_the_reply_in_the_engine_process_with_no_ui(monkeypatch, tmp_path):
    from app.engine_host.protocol import Open
    from bench.tui import earlier_messages, engine_only_run

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    command = Open(model="mini-target", draft=None, no_draft=True, params={"temperature": 0.0, "max_tokens": 24,
                                                                          "ignore_eos": True},
                   messages=earlier_messages(4))
    run, wall = timed(lambda: engine_only_run(command, timeout=120))
    assert_decode_figures(run, 24, wall)
