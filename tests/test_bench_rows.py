"""Every bench row runs, at its smallest setting (`BenchSetup.smoke`), so no row can break unseen: a row
stopped every `mlxchat bench` for days once (store_list_seconds, after caches came to need their ids) and
no test ran it. Rows are grouped by what they load, one test a group; a row added to the bench without a
place here fails `test_every_row_has_a_smoke_run` until it is given one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.command import all_rows
from bench.groups import DEFAULT_ROWS, EXPECTED_SECONDS
from bench.runner import RAISE_ENV, BenchSetup, run_rows
from twin_fixtures import twins_root  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

SMOKE_GROUPS = {  # what each group loads; the groups together hold every row
    "embedded": ("decode_vs_mlx_lm", "paged_kv_overhead", "paged_branch_memory", "paged_decode_vs_standard_long",
                 "pool_peak_vs_held", "spec_speedup_greedy", "spec_vs_mlx_lm_greedy", "accept_vs_mlx_lm_t06",
                 "spec_worst_case", "batch8_throughput_vs_single", "batch8_vs_mlx_lm", "join_stall_seconds",
                 "kv8_bytes_ratio", "kv4_bytes_ratio", "kv8_decode_vs_float_long", "kv8_prefill_peak_vs_float",
                 "kv8_accuracy", "kv4_accuracy", "spec_lone_vs_plain"),
    "sessions": ("turn10_prefill_fraction", "turn10_prefill_fraction_long", "restore_ttft_vs_cold",
                 "autosave_write_ratio", "session_file_write_ratio", "store_list_seconds", "kv8_session_file_ratio"),
    "processes": ("blas_speedup", "tp2_decode_vs_single", "tui_decode_vs_headless", "serve1_vs_ask",
                  "serve8_throughput_vs_mlx_lm", "serve8_ttft_p99_vs_mlx_lm"),
    "twins": ("paged_decode_vs_standard_twin", "sampled_decode_vs_mlx_lm", "greedy_decode_vs_mlx_lm_twin",
              "twin_prefill_vs_mlx_lm", "prefill_steps_8k", "grammar_decode_vs_free", "grammar_mask_us",
              "grammar_spec_accept"),
    "hybrid_twins": ("hybrid_decode_vs_mlx_lm", "hybrid_spec_vs_plain", "hybrid_turn10_prefill_fraction",
                     "hybrid_snapshot_bytes_per_token", "hybrid_batch_vs_alone",
                     "hybrid_request_turn10_prefill_fraction"),
}


def test_every_row_has_a_smoke_run_and_an_expected_time():
    grouped = [name for names in SMOKE_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(set(grouped)), "a row is in two smoke groups"
    assert set(grouped) == set(all_rows()), f"rows without a smoke run: {set(all_rows()) - set(grouped)}"
    assert set(EXPECTED_SECONDS) == set(all_rows()), "every row says how long it takes (bench/groups.py)"
    assert set(DEFAULT_ROWS) <= set(all_rows())


@pytest.mark.slow
@pytest.mark.parametrize("group", SMOKE_GROUPS)
def test_every_row_runs_at_its_smallest_setting(group, twins_root, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLXCHAT_TWINS", str(twins_root))  # the run's twins, built once for every test
    results = run_rows(list(SMOKE_GROUPS[group]), BenchSetup(runs=1, smoke=True), rows=all_rows())
    failed = {name: result["error"] for name, result in results.items() if "error" in result}
    assert not failed, "\n".join(f"{name}: {error}" for name, error in failed.items())
    assert all("value" in result for result in results.values())


def test_a_failing_row_leaves_the_others_in_the_json_and_exit_status_1(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{RAISE_ENV: "paged_kv_overhead"})
    done = subprocess.run([sys.executable, "-m", "app.cli", "bench", "--smoke", "--json", str(out),
                           "--only", "paged_kv_overhead,kv8_bytes_ratio,paged_branch_memory"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert list(rows) == ["paged_kv_overhead", "kv8_bytes_ratio", "paged_branch_memory"]
    assert rows["paged_kv_overhead"]["error"] == f"RuntimeError: made to raise by {RAISE_ENV}"
    assert rows["kv8_bytes_ratio"]["value"] > 0 and rows["paged_branch_memory"]["value"] > 0
    assert "FAILED" in done.stdout and "1 of 3 rows failed: paged_kv_overhead" in done.stderr
    machine = report["machine"]
    assert machine["mlx"] and machine["mlx_lm"] and machine["memory_bytes"] > 0 and machine["chip"]
    assert report["setup"]["model"] == "mini-target" and report["setup"]["draft"] == "mini-draft"


def test_the_help_names_only_what_a_user_has(capsys):
    from app.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    shown = capsys.readouterr().out
    assert "--all" in shown and "--json" in shown
    assert "DESIGN" not in shown and ".md" not in shown
