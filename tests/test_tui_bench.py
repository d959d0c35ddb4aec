"""The TUI benchmark's autosaved chats go to a scratch folder, never to the user's session store."""

from __future__ import annotations

from pathlib import Path

from app.tui_bench import scratch_home
from sessions.store import default_root


def test_bench_sessions_stay_out_of_the_users_store(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "user"))
    with scratch_home() as folder:
        assert default_root() == Path(folder) / "sessions"
        assert not str(default_root()).startswith(str(tmp_path))
    assert default_root() == tmp_path / "user" / "sessions" and not Path(folder).exists()


def test_no_home_before_means_none_after(monkeypatch):
    monkeypatch.delenv("MLXCHAT_HOME", raising=False)
    with scratch_home():
        pass
    assert "mlxchat-bench-" not in str(default_root())


def test_each_side_runs_in_a_new_process_on_the_embedded_model(monkeypatch, tmp_path):
    from app.tui_bench import Workload, side_in_new_process

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    workload = Workload(draft=None, reply_tokens=24, earlier=4)
    assert side_in_new_process("headless", workload)["decode_tps"] > 0
    tui = side_in_new_process("process", workload)
    assert tui["tokens"] == 24 and tui["decode_tps"] > 0
    assert tui["mounted_messages"] == 4 + 2  # the earlier ones, the question, the reply
    assert 0 < tui["ui_cpu_share"] < 2 and tui["lag_s"] >= 0


def test_control_run_generates_the_reply_in_the_engine_process_with_no_ui(monkeypatch, tmp_path):
    from app.tui.protocol import Open
    from app.tui_bench import earlier_messages, engine_only_run

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path))
    command = Open(model="mini-target", draft=None, no_draft=True, params={"temperature": 0.0, "max_tokens": 24},
                   messages=earlier_messages(4), ignore_eos=True)
    run = engine_only_run(command, timeout=120)
    assert run["tokens"] == 24 and run["decode_tps"] > 0
